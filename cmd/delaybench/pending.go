package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pending measures the heap cost of N messages waiting 2 h.
func (b *bench) pending(ctx context.Context) ([]result, []string, error) {
	rows, err := b.pendingDelayd(ctx)
	if err != nil {
		return rows, nil, fmt.Errorf("delayd: %w", err)
	}
	nrow, err := b.pendingNative(ctx)
	if err != nil {
		return rows, nil, fmt.Errorf("native: %w", err)
	}
	return append(rows, nrow), nil, nil
}

// heap returns HeapAlloc after two collections.
func heap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// settledHeap waits -settle (the file store's block caches, and those of
// servers stopped by earlier scenarios, expire), then returns [heap].
func (b *bench) settledHeap(ctx context.Context, label string) (int64, error) {
	b.logf("%s: settling %s before the heap reading", label, b.cfg.Settle)
	if err := sleepCtx(ctx, b.cfg.Settle); err != nil {
		return 0, err
	}
	return heap(), nil
}

func perPending(bytes int64, n int) *float64 {
	v := float64(bytes) / float64(n)
	return &v
}

func (b *bench) pendingDelayd(ctx context.Context) ([]result, error) {
	n := b.cfg.PendingN
	row := result{Scenario: "pending", System: "delayd", Target: "core", N: n}
	e, err := b.newEnv()
	if err != nil {
		return nil, err
	}
	defer e.close()
	svc, err := e.startService(ctx, "2h")
	if err != nil {
		return nil, err
	}
	early, err := e.subscribe("pending.>", 0)
	if err != nil {
		return nil, err
	}
	before, err := b.settledHeap(ctx, "pending delayd: baseline")
	if err != nil {
		return nil, err
	}
	pub, err := b.publishAll(ctx, e, "pending delayd", n, func(i int) *nats.Msg { return b.delaydMsg(i, "pending.x", 1) })
	if err != nil {
		return nil, err
	}
	_, got, err := e.waitLevelMsgs(ctx, 2*time.Hour, "pending.x", uint64(n), 2*time.Minute)
	if err != nil && err != errTimeout {
		return nil, err
	}
	b.waitCount(ctx, "pending delayd: routed", pub.acked, time.Minute, func() int { rs, _ := svc.svc.Stats(); return int(rs.Routed) })
	running, err := b.settledHeap(ctx, "pending delayd: backlog")
	if err != nil {
		return nil, err
	}
	if err := svc.stop(); err != nil {
		return nil, err
	}
	stopped := heap()
	grown := running - before
	row.HeapPerPending, row.HeapBytes = perPending(grown, n), &grown
	row.Lost, row.Early, row.Note = n-int(got), early.count(), refusedNote(n, pub.acked)
	own := running - stopped
	ownRow := result{Scenario: "pending-own", System: "delayd", N: n, HeapPerPending: perPending(own, n), HeapBytes: &own,
		Lost: row.Lost, Early: row.Early, Note: "heap with the service running minus heap after it stopped"}
	return []result{row, ownRow}, nil
}

func (b *bench) pendingNative(ctx context.Context) (result, error) {
	n := b.cfg.PendingN
	row := result{Scenario: "pending", System: "native", Target: "stream", N: n}
	e, err := b.newNativeEnv(ctx)
	if err != nil {
		return row, err
	}
	defer e.close()
	before, err := b.settledHeap(ctx, "pending native: baseline")
	if err != nil {
		return row, err
	}
	due := time.Now().Add(2 * time.Hour)
	pub, err := b.publishAll(ctx, e, "pending native", n, func(i int) *nats.Msg { return b.scheduleMsg(i, due) })
	if err != nil {
		return row, err
	}
	_, got, err := e.waitStreamMsgs(ctx, nativeStream, uint64(n), 2*time.Minute)
	if err != nil && err != errTimeout {
		return row, err
	}
	after, err := b.settledHeap(ctx, "pending native: backlog")
	if err != nil {
		return row, err
	}
	grown := after - before
	produced, err := producedCount(ctx, e)
	if err != nil {
		return row, err
	}
	row.HeapPerPending, row.HeapBytes = perPending(grown, n), &grown
	row.Lost, row.Early, row.Note = n-int(got), produced, refusedNote(n, pub.acked)
	return row, nil
}

// producedCount returns how many messages the schedules produced so far.
func producedCount(ctx context.Context, e *env) (int, error) {
	s, err := e.js.Stream(ctx, nativeStream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("nsched.out.>"))
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, c := range info.State.Subjects {
		total += c
	}
	return int(total), nil
}
