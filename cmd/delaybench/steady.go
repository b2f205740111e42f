package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// steady offers each of -steady-rates msg/s for -steady-duration, each
// message due 1 s after it is published: a delayd row per rate (its Rate
// set), then native schedules at the first rate only: native is no
// target's reference at any rate (issue 13 compares steady with the timer
// floor), at 10,000 msg/s it is already hundreds of ms late, and a row per
// rate would add a row's time to the default run for every rate.
// -steady-rates 30000 alone runs native at 30,000 msg/s.
func (b *bench) steady(ctx context.Context) ([]result, []string, error) {
	var rows []result
	for _, rate := range b.cfg.SteadyRates {
		d, err := b.steadyDelayd(ctx, rate)
		if err != nil {
			return rows, nil, fmt.Errorf("delayd %d/s: %w", rate, err)
		}
		rows = append(rows, d)
	}
	nrow, err := b.steadyNative(ctx, b.cfg.SteadyRates[0])
	if err != nil {
		return rows, nil, fmt.Errorf("native: %w", err)
	}
	return append(rows, nrow), nil, nil
}

// steadyTotal is how many messages a steady row at rate msg/s publishes
// in -steady-duration.
func (b *bench) steadyTotal(rate int) int {
	return int(float64(rate) * b.cfg.SteadyDuration.Seconds())
}

// paced is what a paced publisher did.
type paced struct {
	sent, refused int
	elapsed       time.Duration // first publish to last PubAck (monotonic)
}

// publishPaced publishes rate msg/s for -steady-duration (see
// [bench.publishRate]).
func (b *bench) publishPaced(ctx context.Context, e *env, label string, rate int, mk func(i int) *nats.Msg) (paced, error) {
	return b.publishRate(ctx, e, label, rate, b.steadyTotal(rate), nil, nil, mk)
}

// publishRate publishes rate msg/s in batches every 5 ms, catching up on
// the schedule when a batch ran late, until total are sent (total 0: until
// stop is closed), then waits for the PubAcks. sent, if not nil, follows
// how many were published.
func (b *bench) publishRate(ctx context.Context, e *env, label string, rate, total int, stop <-chan struct{}, sent *atomic.Int64, mk func(i int) *nats.Msg) (paced, error) {
	var refused atomic.Int64
	if sent == nil {
		sent = new(atomic.Int64)
	}
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(pubWindow), jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, _ error) { refused.Add(1) }))
	if err != nil {
		return paced{}, err
	}
	stopProgress := b.progress(label+": published", total, func() int { return int(sent.Load()) })
	defer stopProgress()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	i := 0
	for total == 0 || i < total {
		want := int(float64(rate)*time.Since(start).Seconds()) + 1
		if total > 0 {
			want = min(total, want)
		}
		for ; i < want; i++ {
			if _, err := js.PublishMsgAsync(mk(i), jetstream.WithStallWait(time.Minute)); err != nil {
				refused.Add(1)
			}
		}
		sent.Store(int64(i))
		select {
		case <-ctx.Done():
			return paced{}, ctx.Err()
		case <-stop:
			total = i
		case <-tick.C:
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return paced{}, errors.New("PubAcks still missing after 1 min")
	}
	return paced{sent: i, refused: int(refused.Load()), elapsed: time.Since(start)}, nil
}

func (b *bench) steadyDelayd(ctx context.Context, rate int) (result, error) {
	row := result{Scenario: "steady", System: "delayd", Target: "core", Rate: rate}
	label := fmt.Sprintf("steady %d/s delayd", rate)
	e, err := b.newEnv()
	if err != nil {
		return row, err
	}
	defer e.close()
	svc, err := e.startService(ctx, "1s")
	if err != nil {
		return row, err
	}
	core, err := e.subscribe("steady.core", b.steadyTotal(rate))
	if err != nil {
		return row, err
	}
	p, err := b.publishPaced(ctx, e, label, rate, func(i int) *nats.Msg { return b.delaydMsg(i, "steady.core", 1) })
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, label+": delivered", p.sent, time.Minute, core.count)
	if err := svc.stop(); err != nil {
		return row, err
	}
	t := count(core.arrivals(), p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	row.Note = notes(refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, nil
}

func (b *bench) steadyNative(ctx context.Context, rate int) (result, error) {
	row := result{Scenario: "steady", System: "native", Target: "stream", Rate: rate}
	e, err := b.newNativeEnv(ctx)
	if err != nil {
		return row, err
	}
	defer e.close()
	total := b.steadyTotal(rate)
	due := make([]time.Time, total) // written by the publisher only, read after it is done
	r, err := e.readStream(ctx, nativeStream, "nsched.out.>", total, nil)
	if err != nil {
		return row, err
	}
	p, err := b.publishPaced(ctx, e, "steady native", rate, func(i int) *nats.Msg {
		due[i] = time.Now().Add(time.Second)
		return b.scheduleMsg(i, due[i])
	})
	if err != nil {
		r.stop()
		return row, err
	}
	b.waitCount(ctx, "steady native: produced", p.sent, time.Minute, r.count)
	arrs := r.stop()
	for i := range arrs {
		if a := &arrs[i]; a.idx >= 0 && a.idx < total {
			a.due = due[a.idx]
		}
	}
	t := count(arrs, p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	row.Note = notes(refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, nil
}
