package deliver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLookupGate: lookups through the gate never overlap, and after a
// lookup that took d the next starts no sooner than d×(1/share − 1) after
// it ended (a lower bound the gate guarantees however slow the machine).
func TestLookupGate(t *testing.T) {
	t.Parallel()
	const share = 0.5
	g := newLookupGate(share)
	type span struct{ start, end time.Time }
	var (
		mu      sync.Mutex
		spans   []span
		running atomic.Int32
	)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for range 3 {
				err := g.lookup(context.Background(), func() error {
					if running.Add(1) != 1 {
						t.Error("two lookups ran at once")
					}
					s := span{start: time.Now()}
					time.Sleep(10 * time.Millisecond) // the lookup's work
					s.end = time.Now()
					running.Add(-1)
					mu.Lock()
					spans = append(spans, s)
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if len(spans) != 9 {
		t.Fatalf("%d lookups ran, want 9", len(spans))
	}
	for i := 1; i < len(spans); i++ {
		prev, cur := spans[i-1], spans[i]
		pause := time.Duration(float64(prev.end.Sub(prev.start)) * (1/share - 1))
		if gap := cur.start.Sub(prev.end); gap < pause {
			t.Errorf("lookup %d started %v after lookup %d ended, which took %v: want at least %v", i, gap, i-1, prev.end.Sub(prev.start), pause)
		}
	}
}

// TestLookupGateContext: a wait for the gate ends with its context, and
// leaves the gate usable.
func TestLookupGateContext(t *testing.T) {
	t.Parallel()
	g := newLookupGate(0.01) // a 10 ms lookup closes the gate for about a second
	if err := g.lookup(context.Background(), func() error { time.Sleep(10 * time.Millisecond); return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := false
	if err := g.lookup(ctx, func() error { ran = true; return nil }); err != context.DeadlineExceeded || ran {
		t.Fatalf("lookup during the pause: %v, ran %v; want context.DeadlineExceeded without running", err, ran)
	}
	// The slot was given back: a lookup after the pause runs.
	if err := g.lookup(context.Background(), func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("lookup after the pause: %v, ran %v", err, ran)
	}
}
