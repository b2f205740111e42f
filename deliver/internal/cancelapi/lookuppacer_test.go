package cancelapi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/level"
)

// TestLookupPacer: lookups through the pacer never overlap, and the lookup
// time spent before any lookup starts is at most the burst plus share of
// the time since the pacer was made (the token bucket's bound, which holds
// however slow the machine).
func TestLookupPacer(t *testing.T) {
	t.Parallel()
	const share = 0.5
	t0 := time.Now()
	g := newLookupPacer(share)
	type span struct{ start, end time.Time }
	var (
		mu      sync.Mutex
		spans   []span
		running atomic.Int32
	)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for range 4 {
				err := g.lookup(context.Background(), time.Time{}, func() error {
					if running.Add(1) != 1 {
						t.Error("two lookups ran at once")
					}
					s := span{start: time.Now()}
					time.Sleep(20 * time.Millisecond) // the lookup's work
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
	if len(spans) != 12 {
		t.Fatalf("%d lookups ran, want 12", len(spans))
	}
	var spent time.Duration
	for i, s := range spans {
		if bound := lookupBurst + time.Duration(float64(s.start.Sub(t0))*share); spent > bound {
			t.Errorf("lookup %d started %v after the pacer was made with %v of lookups spent: want at most %v", i, s.start.Sub(t0), spent, bound)
		}
		spent += s.end.Sub(s.start)
	}
}

// TestLookupPacerContext: a wait for the budget ends with its context,
// without running the lookup, and gives the slot back.
func TestLookupPacerContext(t *testing.T) {
	t.Parallel()
	g := newLookupPacer(0.5)
	// 1 s of lookup against a 100 ms burst: the budget is 900 ms short, a
	// wait of about 1.8 s at half a core, which no scheduling delay before
	// the next lookup (under -race, on a loaded machine) makes up.
	if err := g.lookup(context.Background(), time.Time{}, func() error { time.Sleep(time.Second); return nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ran := false
	if err := g.lookup(ctx, time.Time{}, func() error { ran = true; return nil }); !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("lookup while the budget is short: %v, ran %v; want context.DeadlineExceeded without running", err, ran)
	}
	// The slot was given back: a lookup with time to wait runs.
	if err := g.lookup(context.Background(), time.Time{}, func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("lookup after the wait: %v, ran %v", err, ran)
	}
}

// TestLookupPacerNotAfter: a lookup that could not start by its bound
// answers ErrCancelBusy without running, whether it waits for the budget
// or for the slot.
func TestLookupPacerNotAfter(t *testing.T) {
	t.Parallel()
	g := newLookupPacer(0.5)
	// The budget 900 ms short: a wait of about 1.8 s (see
	// TestLookupPacerContext).
	if err := g.lookup(context.Background(), time.Time{}, func() error { time.Sleep(time.Second); return nil }); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := g.lookup(context.Background(), time.Now().Add(20*time.Millisecond), func() error { ran = true; return nil }); !errors.Is(err, level.ErrCancelBusy) || ran {
		t.Fatalf("lookup bound before the budget allows it: %v, ran %v; want ErrCancelBusy without running", err, ran)
	}
	// The slot held by a lookup that runs past the bound.
	g = newLookupPacer(1)
	started, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = g.lookup(context.Background(), time.Time{}, func() error { close(started); <-release; return nil })
	}()
	<-started
	if err := g.lookup(context.Background(), time.Now().Add(20*time.Millisecond), func() error { ran = true; return nil }); !errors.Is(err, level.ErrCancelBusy) || ran {
		t.Fatalf("lookup bound while the slot is held: %v, ran %v; want ErrCancelBusy without running", err, ran)
	}
	close(release)
}

// lookup (test helper: the pacer as index.LookupPaced uses it, around one fn)
// runs fn (one index lookup, or one read of it) once the slot is
// free and the budget is not below zero, and spends the time fn took.
// Without running fn, it returns ctx's error if ctx ends first, and
// [level.ErrCancelBusy] if fn could not start by notAfter (the zero time: no
// bound); else fn's error.
func (g *lookupPacer) lookup(ctx context.Context, notAfter time.Time, fn func() error) error {
	done, err := g.acquire(ctx, notAfter)
	if err != nil {
		return err
	}
	defer done()
	return fn()
}
