package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// crossQuiet is how long the cross-level scenario's trickle runs alone.
const crossQuiet = 3 * time.Second

// crossLevel measures one level's lateness while another level takes a
// burst: on one server and service with the table "1s 1h", a trickle of
// -trickle-rate msg/s to level 1 ("1s", core target) runs alone for 3 s
// (row cross-level-quiet), then again from the start of -burst-n
// messages published at full speed (async, window 4,096) to level 2
// ("1h") until DELAYD_1H holds them all (row cross-level-burst, whose
// over_ref_ms is its lateness minus the quiet row's). Row cross-level-bulk
// is the burst: msgs_per_s = N / (DELAYD_1H holding N − first publish),
// the publisher's rate in its note; its early counts deliveries of the
// burst, none of which is due within the hour.
func (b *bench) crossLevel(ctx context.Context) ([]result, []string, error) {
	const table = "1s 1h"
	n := b.cfg.BurstN
	e, err := b.newEnv()
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	svc, err := e.startService(ctx, table)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = svc.stop() }()
	early, err := e.subscribe("cross.bulk", 0)
	if err != nil {
		return nil, nil, err
	}
	quiet, err := b.trickle(ctx, e, "cross-level-quiet", "cross.quiet", int(float64(b.cfg.TrickleRate)*crossQuiet.Seconds()), nil)
	if err != nil {
		return nil, nil, err
	}
	rows := []result{quiet}

	stop := make(chan struct{})
	type trickled struct {
		r   result
		err error
	}
	busyDone := make(chan trickled, 1)
	go func() {
		r, err := b.trickle(ctx, e, "cross-level-burst", "cross.busy", 0, stop)
		busyDone <- trickled{r, err}
	}()
	start := time.Now()
	pub, err := b.publishAll(ctx, e, "cross-level bulk", n, func(i int) *nats.Msg { return b.delaydMsg(i, "cross.bulk", 2) })
	if err != nil {
		close(stop)
		<-busyDone
		return rows, nil, err
	}
	bulk := result{Scenario: "cross-level-bulk", System: "delayd", Target: "stream", N: n,
		Note: notes(fmt.Sprintf("published at %.0f msg/s", float64(n)/pub.elapsed.Seconds()), refusedNote(n, pub.acked))}
	at, got, werr := e.waitLevelMsgs(ctx, time.Hour, "cross.bulk", uint64(pub.acked), 2*time.Minute)
	close(stop)
	busy := <-busyDone
	if werr != nil && !errors.Is(werr, errTimeout) {
		return rows, nil, werr
	}
	if werr == nil {
		bulk.MsgsPerS = float64(n) / at.Sub(start).Seconds()
	} else {
		bulk.Note = notes(bulk.Note, fmt.Sprintf("timed out: DELAYD_1H holds %d", got))
	}
	bulk.Lost, bulk.Early = n-int(got), early.count()
	if busy.err != nil {
		return append(rows, bulk), nil, busy.err
	}
	return append(rows, busy.r, bulk), nil, nil
}

// trickle publishes -trickle-rate msg/s at level 1 to the core target,
// total messages or (total 0) until stop is closed, waits for their
// delivery and returns the row scenario: lateness = arrival − due.
func (b *bench) trickle(ctx context.Context, e *env, scenario, target string, total int, stop <-chan struct{}) (result, error) {
	row := result{Scenario: scenario, System: "delayd", Target: "core"}
	core, err := e.subscribe(target, total)
	if err != nil {
		return row, err
	}
	p, err := b.publishRate(ctx, e, scenario, b.cfg.TrickleRate, total, stop, nil, func(i int) *nats.Msg { return b.delaydMsg(i, target, 1) })
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, scenario+": delivered", p.sent, 2*time.Minute, core.count)
	t := count(core.arrivals(), p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	row.Note = notes(refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, nil
}
