package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
)

// Reference rows: the work of a delayd row with the scheduling taken out,
// written as directly as nats.go's jetstream package allows (issue 13's
// yardsticks). Each runs on a fresh server, with -burst-n messages of
// -payload bytes (the burst's) preloaded into a stream SRC, except the
// timer floor, which runs at each of -steady-rates for -steady-duration.
const (
	// refPull is the reference readers' client buffer, messages.
	refPull = 8192
	// refAckPending bounds the move ceiling's unacknowledged source
	// messages.
	refAckPending = 1 << 16
)

// ref runs the four references: ref-drain, ref-stream, ref-move, and
// ref-timer once per steady rate.
func (b *bench) ref(ctx context.Context) ([]result, []string, error) {
	fs := []func(context.Context) (result, error){b.refDrain, b.refStream, b.refMove}
	for _, rate := range b.cfg.SteadyRates {
		fs = append(fs, func(ctx context.Context) (result, error) { return b.refTimer(ctx, rate) })
	}
	var rows []result
	for _, f := range fs {
		r, err := f(ctx)
		if err != nil {
			return rows, nil, fmt.Errorf("%s: %w", r.Scenario, err)
		}
		rows = append(rows, r)
	}
	return rows, nil, nil
}

// refSource starts a fresh server holding -burst-n messages in the stream
// SRC (subjects src.>), a work queue if workQueue.
func (b *bench) refSource(ctx context.Context, label string, workQueue bool) (*env, error) {
	e, err := b.newEnv()
	if err != nil {
		return nil, err
	}
	cfg := jetstream.StreamConfig{Name: "SRC", Subjects: []string{"src.>"}}
	if workQueue {
		cfg.Retention = jetstream.WorkQueuePolicy
	}
	if err := e.createStream(ctx, cfg); err != nil {
		e.close()
		return nil, err
	}
	n := b.cfg.BurstN
	pub, err := b.publishAll(ctx, e, label+": preload", n, func(i int) *nats.Msg {
		return &nats.Msg{Subject: "src.x", Data: payload(i, b.cfg.Payload)}
	})
	if err != nil {
		e.close()
		return nil, err
	}
	if pub.acked != n {
		e.close()
		return nil, fmt.Errorf("preload: %s", refusedNote(n, pub.acked))
	}
	return e, nil
}

// readSource reads SRC with an ordered consumer on a connection of its
// own, calling each with the payload; read follows how many were read.
func (e *env) readSource(ctx context.Context, js jetstream.JetStream, read *atomic.Int64, each func(data []byte)) (jetstream.ConsumeContext, error) {
	cons, err := js.OrderedConsumer(ctx, "SRC", jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	return cons.Consume(func(m jetstream.Msg) {
		each(m.Data())
		read.Add(1)
	}, jetstream.PullMaxMessages(refPull))
}

// refDrain is the drain ceiling: an ordered consumer reads SRC and
// republishes each payload to the core subject drain.out; a core
// subscriber counts them. msgs_per_s = N / (last arrival − start).
func (b *bench) refDrain(ctx context.Context) (result, error) {
	n := b.cfg.BurstN
	row := result{Scenario: "ref-drain", System: "raw", Target: "core", N: n}
	e, err := b.refSource(ctx, "ref-drain", false)
	if err != nil {
		return row, err
	}
	defer e.close()
	core, err := e.subscribe("drain.out", n)
	if err != nil {
		return row, err
	}
	rnc, err := e.conn(nil)
	if err != nil {
		return row, err
	}
	rjs, err := jetstream.New(rnc)
	if err != nil {
		return row, err
	}
	var read atomic.Int64
	start := time.Now()
	cc, err := e.readSource(ctx, rjs, &read, func(data []byte) { _ = rnc.Publish("drain.out", data) })
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, "ref-drain: received", n, 2*time.Minute, core.count)
	cc.Stop()
	t := count(core.arrivals(), n, nil)
	row.Lost, row.Early, row.Note = t.lost, t.early, dupNote(t.dups)
	if t.distinct > 0 {
		row.MsgsPerS = float64(t.distinct) / t.last.Sub(start).Seconds()
	}
	return row, nil
}

// refStream is the stream-bound ceiling: the read of [bench.refDrain],
// each payload published with PublishAsync (window [pubWindow]) to
// bound.x, bound to the stream BOUND. msgs_per_s = N / (last PubAck −
// start); lost = N − BOUND's messages.
func (b *bench) refStream(ctx context.Context) (result, error) {
	n := b.cfg.BurstN
	row := result{Scenario: "ref-stream", System: "raw", Target: "stream", N: n}
	e, err := b.refSource(ctx, "ref-stream", false)
	if err != nil {
		return row, err
	}
	defer e.close()
	if err := e.createStream(ctx, jetstream.StreamConfig{Name: "BOUND", Subjects: []string{"bound.>"}}); err != nil {
		return row, err
	}
	rnc, err := e.conn(nil)
	if err != nil {
		return row, err
	}
	var refused atomic.Int64
	rjs, err := jetstream.New(rnc, jetstream.WithPublishAsyncMaxPending(pubWindow), jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { refused.Add(1) }))
	if err != nil {
		return row, err
	}
	var read atomic.Int64
	start := time.Now()
	cc, err := e.readSource(ctx, rjs, &read, func(data []byte) {
		if _, err := rjs.PublishAsync("bound.x", data, jetstream.WithStallWait(time.Minute)); err != nil {
			refused.Add(1)
		}
	})
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, "ref-stream: read", n, 2*time.Minute, func() int { return int(read.Load()) })
	cc.Stop()
	select {
	case <-rjs.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return row, errors.New("PubAcks still missing after 1 min")
	}
	elapsed := time.Since(start)
	stored, err := e.streamMsgs(ctx, "BOUND")
	if err != nil {
		return row, err
	}
	row.MsgsPerS = float64(stored) / elapsed.Seconds()
	row.Lost = n - int(stored)
	row.Note = refusedNote(n, n-int(refused.Load()))
	return row, nil
}

// refMove is the move ceiling: the router's store operations without
// classification. A durable pull consumer (explicit ack) reads the work
// queue SRC; each payload is published with PublishMsgAsync (window
// [pubWindow]) to dst.x, bound to the stream DST, and its source message
// acked once that PubAck is in (in order, by one goroutine).
// msgs_per_s = N / (time SRC is empty and DST holds N − start).
func (b *bench) refMove(ctx context.Context) (result, error) {
	n := b.cfg.BurstN
	row := result{Scenario: "ref-move", System: "raw", Target: "stream", N: n}
	e, err := b.refSource(ctx, "ref-move", true)
	if err != nil {
		return row, err
	}
	defer e.close()
	if err := e.createStream(ctx, jetstream.StreamConfig{Name: "DST", Subjects: []string{"dst.>"}}); err != nil {
		return row, err
	}
	if _, err := e.js.CreateConsumer(ctx, "SRC", jetstream.ConsumerConfig{
		Durable: "mover", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: refAckPending, AckWait: time.Minute,
	}); err != nil {
		return row, err
	}
	mnc, err := e.conn(nil)
	if err != nil {
		return row, err
	}
	var refused, acked atomic.Int64
	mjs, err := jetstream.New(mnc, jetstream.WithPublishAsyncMaxPending(pubWindow), jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return row, err
	}
	mcons, err := mjs.Consumer(ctx, "SRC", "mover")
	if err != nil {
		return row, err
	}
	type move struct {
		f jetstream.PubAckFuture
		m jetstream.Msg
	}
	moves := make(chan move, 2*pubWindow)
	stopAcker, ackerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ackerDone)
		for {
			var mv move
			select {
			case mv = <-moves:
			case <-stopAcker:
				return
			}
			select {
			case <-mv.f.Ok():
				_ = mv.m.Ack()
				acked.Add(1)
			case <-mv.f.Err():
				refused.Add(1) // left unacked: redelivered after AckWait
			case <-stopAcker:
				return
			}
		}
	}()
	start := time.Now()
	cc, err := mcons.Consume(func(m jetstream.Msg) {
		f, err := mjs.PublishMsgAsync(&nats.Msg{Subject: "dst.x", Data: m.Data()}, jetstream.WithStallWait(time.Minute))
		if err != nil {
			refused.Add(1)
			return
		}
		select {
		case moves <- move{f, m}:
		case <-stopAcker:
		}
	}, jetstream.PullMaxMessages(refPull))
	if err != nil {
		close(stopAcker)
		return row, err
	}
	stop := b.progress("ref-move: moved", n, func() int { return int(acked.Load()) })
	at, moved, werr := waitMsgs(ctx, uint64(n), 2*time.Minute, func() (uint64, error) {
		dst, err := e.streamMsgs(ctx, "DST")
		if err != nil {
			return 0, err
		}
		src, err := e.streamMsgs(ctx, "SRC")
		if err != nil {
			return 0, err
		}
		return min(dst, uint64(n)-min(src, uint64(n))), nil
	})
	stop()
	cc.Stop()
	close(stopAcker)
	<-ackerDone
	if werr != nil && !errors.Is(werr, errTimeout) {
		return row, werr
	}
	dst, err := e.streamMsgs(ctx, "DST")
	if err != nil {
		return row, err
	}
	row.Lost = n - int(dst)
	if werr == nil {
		row.MsgsPerS = float64(n) / at.Sub(start).Seconds()
	} else {
		row.Note = fmt.Sprintf("timed out: %d moved", moved)
	}
	row.Note = notes(row.Note, refusedNote(n, n-int(refused.Load())))
	return row, nil
}

// refTimer is the timer floor: rate msg/s for -steady-duration published
// to the core subject timer.in, each with Delay-Due-At = publish time +
// 1 s; a relay on a connection of its own receives each (core
// subscription), holds it in a Go timer (time.AfterFunc) until its due
// time and publishes it to the core subject timer.out, where a core
// subscriber takes lateness = arrival − due, as the steady row does. No
// storage: the lateness of the machine itself at that rate.
func (b *bench) refTimer(ctx context.Context, rate int) (result, error) {
	row := result{Scenario: "ref-timer", System: "raw", Target: "core", Rate: rate}
	e, err := b.newEnv()
	if err != nil {
		return row, err
	}
	defer e.close()
	total := b.steadyTotal(rate)
	core, err := e.subscribe("timer.out", total)
	if err != nil {
		return row, err
	}
	rnc, err := e.conn(nil)
	if err != nil {
		return row, err
	}
	sub, err := rnc.Subscribe("timer.in", func(m *nats.Msg) {
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
		if err != nil {
			return
		}
		out := &nats.Msg{Subject: "timer.out", Header: m.Header, Data: m.Data}
		time.AfterFunc(time.Until(due), func() { _ = rnc.PublishMsg(out) })
	})
	if err != nil {
		return row, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return row, err
	}
	if err := rnc.Flush(); err != nil {
		return row, err
	}
	sent, elapsed, err := b.publishCore(ctx, e.nc, fmt.Sprintf("ref-timer %d/s", rate), rate, total, func(i int) *nats.Msg {
		return &nats.Msg{
			Subject: "timer.in",
			Header:  nats.Header{contract.HeaderDueAt: []string{contract.FormatTime(time.Now().Add(time.Second))}},
			Data:    payload(i, b.cfg.Payload),
		}
	})
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, fmt.Sprintf("ref-timer %d/s: delivered", rate), sent, time.Minute, core.count)
	t := count(core.arrivals(), sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = sent, float64(sent)/elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	row.Note = dupNote(t.dups)
	return row, nil
}

// publishCore publishes rate msg/s of core messages built by mk on nc, in
// batches every 5 ms as [bench.publishRate], until total are sent, then
// flushes. It returns how many were sent and the time it took.
func (b *bench) publishCore(ctx context.Context, nc *nats.Conn, label string, rate, total int, mk func(i int) *nats.Msg) (int, time.Duration, error) {
	var sent atomic.Int64
	stop := b.progress(label+": published", total, func() int { return int(sent.Load()) })
	defer stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	i := 0
	for i < total {
		want := min(total, int(float64(rate)*time.Since(start).Seconds())+1)
		for ; i < want; i++ {
			if err := nc.PublishMsg(mk(i)); err != nil {
				return i, 0, err
			}
		}
		sent.Store(int64(i))
		select {
		case <-ctx.Done():
			return i, 0, ctx.Err()
		case <-tick.C:
		}
	}
	if err := nc.Flush(); err != nil {
		return i, 0, err
	}
	return i, time.Since(start), nil
}
