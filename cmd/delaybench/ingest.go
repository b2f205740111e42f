package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// ingest pre-loads N messages at level 3 ("1h") while delayd is stopped, then
// times the router moving them into DELAYD_1H.
func (b *bench) ingest(ctx context.Context) ([]result, []string, error) {
	const table = "1s 5s 1h"
	n := b.cfg.N
	e, err := b.newEnv()
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	if err := e.createDelaydStreams(ctx, table); err != nil {
		return nil, nil, err
	}
	early, err := e.subscribe("bench.>", 0) // nothing may be delivered within the hour
	if err != nil {
		return nil, nil, err
	}
	pub, err := b.publishAll(ctx, e, "ingest", n, func(i int) *nats.Msg { return b.delaydMsg(i, "bench.x", 3) })
	if err != nil {
		return nil, nil, err
	}

	start := time.Now()
	svc, err := e.startService(ctx, table)
	if err != nil {
		return nil, nil, err
	}
	stop := b.progress("ingest: routed", n, func() int { m, _ := e.levelMsgs(ctx, time.Hour, "bench.x"); return int(m) })
	at, got, err := e.waitLevelMsgs(ctx, time.Hour, "bench.x", uint64(n), 2*time.Minute)
	stop()
	row := result{Scenario: "ingest", System: "delayd", Target: "stream", N: n, Lost: n - int(got), Early: early.count(), Note: refusedNote(n, pub.acked)}
	if err == nil {
		row.MsgsPerS = float64(n) / at.Sub(start).Seconds()
	} else if err != errTimeout {
		return nil, nil, err
	} else {
		row.Note = notes(row.Note, fmt.Sprintf("timed out: DELAYD_1H holds %d", got))
	}
	if err := svc.stop(); err != nil {
		return []result{row}, nil, err
	}
	return []result{row}, nil, nil
}
