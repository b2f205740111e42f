package ownership

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// planClaimer is a fake [lease.Claimer] that records every claim, in
// order, and holds the claims of the keys in hold until release is
// closed: a First elector's first bid is then not answered (its Tried
// stays open) for as long as the test wants.
type planClaimer struct {
	hold     map[string]bool
	release  chan struct{}
	released sync.Once

	mu  sync.Mutex
	log []string // "claim <key>" when asked, "answered <key>" when a held claim returns
	got chan string
}

func (c *planClaimer) Claim(key string, _ time.Duration) (func(), bool) {
	c.note("claim " + key)
	if c.hold[key] {
		<-c.release
		c.note("answered " + key)
	}
	return func() {}, true
}

// free answers the held claims, once.
func (c *planClaimer) free() { c.released.Do(func() { close(c.release) }) }

func (c *planClaimer) note(s string) {
	c.mu.Lock()
	c.log = append(c.log, s)
	c.mu.Unlock()
	select {
	case c.got <- s:
	default: // the test reads the log instead
	}
}

func (c *planClaimer) logCopy() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// TestPlanThenAfterFirst: a Plan's Then elector does not bid (no
// TryAcquire, seen as no claim) before every First elector's first bid
// was answered (docs/reshape.md#7-risks-rules-that-live-in-comments-today-and-how-the-structure-enforces-them, R1: the routers bid only after
// every level's and the janitor's first bid); then it bids, and every
// elector returns nil when the Plan's context ends.
func TestPlanThenAfterFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := &planClaimer{hold: map[string]bool{"level.DELAYD_1S": true, JanitorKey: true}, release: make(chan struct{}),
		got: make(chan string, 16)}
	work := func(ctx context.Context, _ Term) error { <-ctx.Done(); return nil }
	lease := func(key string) Lease {
		e, err := New(Config{Bucket: b.bucket, Key: key, Holder: "a", TTL: testTTL, claimer: c})
		if err != nil {
			t.Fatal(err)
		}
		return Lease{e: e, work: work}
	}
	p := Plan{First: []Lease{lease("level.DELAYD_1S"), lease(JanitorKey)}, Then: []Lease{lease(RouterKey)}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		c.free() // a held claim would keep its elector from returning
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Plan.Run: %v", err)
		}
	}()

	next := func(within time.Duration) string {
		t.Helper()
		select {
		case s := <-c.got:
			return s
		case <-time.After(within):
			t.Fatalf("no claim within %s; claims %v", within, c.logCopy())
		}
		return ""
	}
	// Both First electors bid; their claims are held.
	for range 2 {
		if s := next(10 * time.Second); s == "claim "+RouterKey {
			t.Fatalf("the Then elector bid before the First electors' first bids were answered: %v", c.logCopy())
		}
	}
	// While they are held, the Then elector must not bid.
	select {
	case s := <-c.got:
		t.Fatalf("%q while the First electors' first bids were unanswered: %v", s, c.logCopy())
	case <-time.After(300 * time.Millisecond):
	}
	c.free()
	// Now it bids, after both First claims were answered.
	for !slices.Contains(c.logCopy(), "claim "+RouterKey) {
		next(10 * time.Second)
	}
	log := c.logCopy()
	then := slices.Index(log, "claim "+RouterKey)
	for _, k := range []string{"level.DELAYD_1S", JanitorKey} {
		if a := slices.Index(log, "answered "+k); a < 0 || a > then {
			t.Fatalf("the Then elector bid before %s's first bid was answered: %s", k, strings.Join(log, ", "))
		}
	}
}
