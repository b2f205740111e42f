package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
)

// Native message schedule headers (nats-server 2.12+, server/stream.go).
const (
	hdrSchedule       = "Nats-Schedule"
	hdrScheduleTarget = "Nats-Schedule-Target"
	nativeStream      = "NSCHED"
)

// burst runs n messages all due at the same instant: delayd to a core
// subscriber and to a stream-bound target, native schedules to the stream,
// each row named scenario ("burst" with -burst-n, "burst-1m" with
// -burst-1m-n). Native runs last, so its rows are related to delayd's
// here rather than in [output.relate]: each delayd row gets NativeRatio
// (see [nativeRatios]).
func (b *bench) burst(ctx context.Context, scenario string, n int) ([]result, []string, error) {
	var rows []result
	for _, target := range []string{"core", "stream"} {
		r, err := b.burstDelayd(ctx, scenario, target, n)
		if err != nil {
			return rows, nil, fmt.Errorf("delayd %s: %w", target, err)
		}
		rows = append(rows, r)
	}
	nrows, notes, err := b.burstNative(ctx, scenario, n)
	if err != nil {
		return rows, notes, fmt.Errorf("native: %w", err)
	}
	rows = append(rows, nrows...)
	nativeRatios(rows)
	return rows, notes, nil
}

// nativeRatios sets NativeRatio on each delayd row of rows: its last
// arrival after due (lateness max) over that of the native row with the
// stream target (native has no core row: its schedules never reach core
// subscribers). Rows without lateness, or a native max of 0, get none.
func nativeRatios(rows []result) {
	i := slices.IndexFunc(rows, func(r result) bool { return r.System == "native" && r.Target == "stream" })
	if i < 0 || rows[i].Lateness == nil || rows[i].Lateness.Max <= 0 {
		return
	}
	native := rows[i].Lateness.Max
	for j := range rows {
		if r := &rows[j]; r.System == "delayd" && r.Lateness != nil {
			v := r.Lateness.Max / native
			r.NativeRatio = &v
		}
	}
}

// burstWait is how long a burst of n waits for each of its phases
// (routing, delivery, reading back): 2 min, and 1 s more per 5,000
// messages (a million: 5 min 20 s).
func burstWait(n int) time.Duration {
	return 2*time.Minute + time.Duration(n/5000)*time.Second
}

// burstDelayd routes N messages into DELAYD_1S with the router alone, waits
// until the last is due, then starts the service at T (-tcp: starts the
// delayd process before, while holding the level's lease, and releases
// the lease at T).
func (b *bench) burstDelayd(ctx context.Context, scenario, target string, n int) (result, error) {
	const table = "1s"
	label := scenario + " delayd " + target
	row := result{Scenario: scenario, System: "delayd", Target: target, N: n}
	e, err := b.newEnv()
	if err != nil {
		return row, err
	}
	defer e.close()
	if err := e.createDelaydStreams(ctx, table); err != nil {
		return row, err
	}
	subject := "burst." + target
	if target == "stream" {
		if err := e.createStream(ctx, jetstream.StreamConfig{Name: "BURST", Subjects: []string{"burst.>"}}); err != nil {
			return row, err
		}
	}

	// The router alone: messages reach the level stream, no scanner runs.
	rnc, err := e.conn(nil)
	if err != nil {
		return row, err
	}
	rjs, err := jetstream.New(rnc, jetstream.WithPublishAsyncTimeout(10*time.Second), jetstream.WithPublishAsyncMaxPending(deliver.RouterMaxInFlightDefault+16))
	if err != nil {
		return row, err
	}
	router, err := deliver.NewRouter(rjs, deliver.RouterConfig{Prefix: prefix, Levels: levels.MustParse(table)})
	if err != nil {
		return row, err
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- router.Run(rctx) }()
	pub, err := b.publishAll(ctx, e, label, n, func(i int) *nats.Msg { return b.delaydMsg(i, subject, 1) })
	if err != nil {
		rcancel()
		return row, err
	}
	row.Note = refusedNote(n, pub.acked)
	ok := b.waitCount(ctx, label+": routed", pub.acked, burstWait(n), func() int { return int(router.Stats().Routed) })
	rcancel()
	if err := <-rdone; err != nil {
		return row, fmt.Errorf("router: %w", err)
	}
	if !ok {
		row.Note = notes(row.Note, fmt.Sprintf("routing timed out at %d", router.Stats().Routed))
	}

	// -tcp: a delayd process takes a while to start, so it starts now,
	// while the benchmark holds the level's lease (as cluster-burst does):
	// it routes, but delivers nothing until the lease is released at T.
	var svc *service
	var hold *lease.Lease
	if e.url != "" {
		if hold, err = holdLease(ctx, e, levelLease); err != nil {
			return row, err
		}
		defer func() { _ = hold.Release(context.Background()) }()
		if svc, err = e.startService(ctx, table); err != nil {
			return row, err
		}
	}

	// Wait until the last routed message is due.
	lastDue, err := lastDue(ctx, e, levels.StreamName(time.Second))
	if err != nil {
		return row, err
	}
	if err := sleepCtx(ctx, time.Until(lastDue)+10*time.Millisecond); err != nil {
		return row, err
	}

	var core *collector
	if target == "core" {
		if core, err = e.subscribe(subject, n); err != nil {
			return row, err
		}
	}
	t0 := time.Now()
	if hold != nil {
		if _, valid := hold.Held(); !valid {
			return row, fmt.Errorf("the benchmark lost %s before T", levelLease)
		}
		if err := hold.Release(ctx); err != nil {
			return row, err
		}
		b.logf("%s: released %s at T", label, levelLease)
	} else {
		if svc, err = e.startService(ctx, table); err != nil {
			return row, err
		}
		b.logf("%s: service ready %s after T", label, time.Since(t0).Round(time.Millisecond))
	}
	var arrs []arrival
	if core != nil {
		b.waitCount(ctx, label+": delivered", n, burstWait(n), core.count)
		arrs = core.arrivals()
	} else {
		_, _, err := e.waitStreamMsgs(ctx, "BURST", uint64(n), burstWait(n))
		if err != nil && !errors.Is(err, errTimeout) {
			return row, err
		}
		r, err := e.readStream(ctx, "BURST", "", n, dueHeader)
		if err != nil {
			return row, err
		}
		b.waitCount(ctx, label+": read back", n, burstWait(n), r.count)
		arrs = r.stop()
	}
	if err := svc.stop(); err != nil {
		return row, err
	}
	t := count(arrs, n, func(a arrival) time.Time { return later(a.due, t0) })
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	if t.distinct > 0 {
		row.MsgsPerS = float64(t.distinct) / t.last.Sub(t0).Seconds()
		b.logf("%s: first arrival %s after T, last %s", label, t.first.Sub(t0).Round(time.Millisecond), t.last.Sub(t0).Round(time.Millisecond))
	}
	row.Note = notes(row.Note, dupNote(t.dups))
	return row, nil
}

// holdLease acquires the lease key in delayd's lease bucket (one replica)
// for the benchmark, as a replica would.
func holdLease(ctx context.Context, e *env, key string) (*lease.Lease, error) {
	bucket, err := lease.OpenBucket(ctx, e.js, lease.BucketConfig{Replicas: 1})
	if err != nil {
		return nil, err
	}
	l, err := lease.New(bucket, lease.Config{Key: key, Holder: "delaybench"})
	if err != nil {
		return nil, err
	}
	return l, l.Acquire(ctx)
}

// lastDue reads Delay-Due-At of a level stream's last message that has
// one: a router's epoch marker (no Delay-Due-At) may follow the messages,
// written when a router term starts, as under load a lease moves.
func lastDue(ctx context.Context, e *env, stream string) (time.Time, error) {
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		return time.Time{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if info.State.Msgs == 0 {
		return time.Now(), nil
	}
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0; seq-- {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return time.Time{}, err
		}
		if due := m.Header.Get(contract.HeaderDueAt); due != "" {
			return time.Parse(time.RFC3339Nano, due)
		}
	}
	return time.Now(), nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// newNativeEnv starts a server with a stream that allows message schedules
// on nsched.>.
func (b *bench) newNativeEnv(ctx context.Context) (*env, error) {
	e, err := b.newEnv()
	if err != nil {
		return nil, err
	}
	if err := e.createStream(ctx, jetstream.StreamConfig{Name: nativeStream, Subjects: []string{"nsched.>"}, AllowMsgSchedules: true}); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// scheduleMsg is native schedule i: due at `at`, producing nsched.out.<i>.
// Each schedule needs a subject of its own: the server keeps one schedule
// per subject, and a newer one replaces it.
func (b *bench) scheduleMsg(i int, at time.Time) *nats.Msg {
	is := strconv.Itoa(i)
	return &nats.Msg{
		Subject: "nsched.sched." + is,
		Header: nats.Header{
			hdrSchedule:       []string{"@at " + contract.FormatTime(at)},
			hdrScheduleTarget: []string{"nsched.out." + is},
		},
		Data: payload(i, b.cfg.Payload),
	}
}

// burstNative publishes n one-shot schedules "@at T" and measures the
// produced messages' store times against T.
func (b *bench) burstNative(ctx context.Context, scenario string, n int) ([]result, []string, error) {
	label := scenario + " native"
	e, err := b.newNativeEnv(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	core, err := e.subscribe("nsched.out.>", n)
	if err != nil {
		return nil, nil, err
	}
	// T must lie beyond the last publish, or the schedules stored after T
	// are late by their publishing alone (the row's note says so): 2 s,
	// and 60 µs a schedule (about 30 µs each on a quiet machine; a million
	// took 59 s beside other work, past a lead of 32 s).
	lead := 2*time.Second + time.Duration(n)*60*time.Microsecond
	t0 := time.Now().Add(lead)
	pub, err := b.publishAll(ctx, e, label, n, func(i int) *nats.Msg { return b.scheduleMsg(i, t0) })
	if err != nil {
		return nil, nil, err
	}
	row := result{Scenario: scenario, System: "native", Target: "stream", N: n, Note: refusedNote(n, pub.acked)}
	if over := time.Since(t0); over > 0 {
		row.Note = notes(row.Note, fmt.Sprintf("publishing ended %s after T: later schedules were stored past due", over.Round(time.Millisecond)))
	}
	r, err := e.readStream(ctx, nativeStream, "nsched.out.>", n, func(jetstream.Msg) time.Time { return t0 })
	if err != nil {
		return nil, nil, err
	}
	b.waitCount(ctx, label+": produced", n, time.Until(t0)+burstWait(n), r.count)
	arrs := r.stop()
	t := count(arrs, n, func(arrival) time.Time { return t0 })
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	if t.distinct > 0 {
		row.MsgsPerS = float64(t.distinct) / t.last.Sub(t0).Seconds()
		b.logf("%s: first arrival %s after T, last %s", label, t.first.Sub(t0).Round(time.Millisecond), t.last.Sub(t0).Round(time.Millisecond))
	}
	row.Note = notes(row.Note, dupNote(t.dups))
	rows := []result{row}

	var notesOut []string
	if got := core.count(); got == 0 {
		notesOut = append(notesOut, fmt.Sprintf("%s/native: a core subscriber on nsched.out.> received 0 of %d produced messages (the server stores them without publishing to core subscribers), so native has no core row", scenario, t.distinct))
	} else {
		carrs := core.arrivals()
		for i := range carrs {
			carrs[i].due = t0
		}
		ct := count(carrs, n, func(arrival) time.Time { return t0 })
		crow := result{Scenario: scenario, System: "native", Target: "core", N: n, Lost: ct.lost, Early: ct.early, Lateness: ct.lateness, Note: dupNote(ct.dups)}
		if ct.distinct > 0 {
			crow.MsgsPerS = float64(ct.distinct) / ct.last.Sub(t0).Seconds()
		}
		rows = append(rows, crow)
	}
	return rows, notesOut, nil
}
