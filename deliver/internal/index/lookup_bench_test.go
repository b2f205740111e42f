package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

// BenchmarkLookupIndex measures one id-index lookup (what a cancel or a
// merge check reads) against an index of 60,000 and of 600,000 placements
// (10k msg/s for 6 s, and for the minute IndexKeep holds), written as the
// router writes them at a steady 10k msg/s: groups of about 150
// placements, one message per slot touched. ns/op is the lookup's wall
// time, server and client, with the server in this process.
//
//	go test -run '^$' -bench BenchmarkLookup -benchtime 50x ./deliver/internal/index
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{60_000, 600_000} {
		b.Run(fmt.Sprintf("placements=%d", n), func(b *testing.B) { benchmarkLookup(b, n) })
	}
}

func benchmarkLookup(b *testing.B, lookupBenchPlacements int) {
	nc, js := natstest.Connect(b)
	ctx := context.Background()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		b.Fatal(err)
	}
	const group = 150
	due := time.Now()
	for i := 0; i < lookupBenchPlacements; i += group {
		g := NewGroup()
		for j := i; j < i+group && j < lookupBenchPlacements; j++ {
			g.Add(Record{Key: UserKey(fmt.Sprintf("order-%d", j)), Stream: "DELAYD_1S", Seq: uint64(j + 1), Due: due, Target: "orders.close"})
		}
		g.Flush(js)
		if err := g.Stored(); err != nil {
			b.Fatal(err)
		}
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	for _, kind := range []string{"known", "unknown"} {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				key := UserKey(fmt.Sprintf("order-%d", rand.IntN(lookupBenchPlacements)))
				if kind == "unknown" {
					key = UserKey(fmt.Sprintf("no-such-%d", rand.Int()))
				}
				_, ok, err := Lookup(ctx, reader, key, 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if ok != (kind == "known") {
					b.Fatalf("lookup %q: found %v", key, ok)
				}
			}
		})
	}
}
