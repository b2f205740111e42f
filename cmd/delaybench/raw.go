package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// raw is the reference: N async publishes into a plain file stream, then an
// ordered-consumer read of them.
func (b *bench) raw(ctx context.Context) ([]result, []string, error) {
	n := b.cfg.N
	e, err := b.newEnv()
	if err != nil {
		return nil, nil, err
	}
	defer e.close()
	if err := e.createStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}}); err != nil {
		return nil, nil, err
	}
	pub, err := b.publishAll(ctx, e, "raw", n, func(i int) *nats.Msg {
		return &nats.Msg{Subject: "raw.x", Data: payload(i, b.cfg.Payload)}
	})
	if err != nil {
		return nil, nil, err
	}
	stored, err := e.streamMsgs(ctx, "RAW")
	if err != nil {
		return nil, nil, err
	}
	rows := []result{{
		Scenario: "raw-publish", System: "raw", Target: "stream", N: n,
		MsgsPerS: float64(n) / pub.elapsed.Seconds(), Lost: n - int(stored),
		Note: refusedNote(n, pub.acked),
	}}

	start := time.Now()
	r, err := e.readStream(ctx, "RAW", "", n, nil)
	if err != nil {
		return rows, nil, err
	}
	b.waitCount(ctx, "raw: read", n, time.Minute, r.count)
	elapsed := time.Since(start)
	t := count(r.stop(), n, nil)
	rows = append(rows, result{
		Scenario: "raw-read", System: "raw", Target: "stream", N: n,
		MsgsPerS: float64(t.distinct) / elapsed.Seconds(), Lost: t.lost, Early: t.early,
		Note: dupNote(t.dups),
	})
	return rows, nil, nil
}

func refusedNote(n, acked int) string {
	if acked == n {
		return ""
	}
	return fmt.Sprintf("%d of %d publishes refused or unacknowledged", n-acked, n)
}

func dupNote(dups int) string {
	if dups == 0 {
		return ""
	}
	return fmt.Sprintf("%d duplicate deliveries", dups)
}
