package deliver

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
//	go test -run '^$' -bench BenchmarkLookupIndex -benchtime 50x ./deliver
func BenchmarkLookupIndex(b *testing.B) {
	for _, n := range []int{60_000, 600_000} {
		b.Run(fmt.Sprintf("placements=%d", n), func(b *testing.B) { benchmarkLookupIndex(b, n) })
	}
}

func benchmarkLookupIndex(b *testing.B, lookupBenchPlacements int) {
	nc, js := natstest.Connect(b)
	ctx := context.Background()
	if err := ensureIndexStreams(ctx, js, 1); err != nil {
		b.Fatal(err)
	}
	const group = 150
	due := time.Now()
	for i := 0; i < lookupBenchPlacements; i += group {
		g := newIndexGroup()
		for j := i; j < i+group && j < lookupBenchPlacements; j++ {
			g.add(indexRecord{key: userKey(fmt.Sprintf("order-%d", j)), stream: "DELAYD_1S", seq: uint64(j + 1), due: due, target: "orders.close"})
		}
		g.flush(js)
		if err := g.stored(); err != nil {
			b.Fatal(err)
		}
	}
	reader, err := jswire.NewBatchReader(nc, lookupPage)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	for _, kind := range []string{"known", "unknown"} {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				key := userKey(fmt.Sprintf("order-%d", rand.IntN(lookupBenchPlacements)))
				if kind == "unknown" {
					key = userKey(fmt.Sprintf("no-such-%d", rand.Int()))
				}
				_, ok, err := lookupIndex(ctx, reader, key)
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
