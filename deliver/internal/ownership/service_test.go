package ownership

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// planClaimer is a fake [lease.Claimer] that records every claim, in
// order, and holds the claims of the keys in held until free(key): a First
// elector's first bid is then not answered (its Tried stays open) for as
// long as the test wants.
type planClaimer struct {
	mu   sync.Mutex
	held map[string]chan struct{} // key -> closed (and deleted) by free(key)
	log  []string                 // "claim <key>" when asked, "answered <key>" when a held claim returns
	got  chan string
}

func (c *planClaimer) Claim(key string, _ time.Duration) (func(), bool) {
	c.mu.Lock()
	hold := c.held[key] // before the note: the test may free key once it has seen the claim
	c.mu.Unlock()
	c.note("claim " + key)
	if hold != nil {
		<-hold
		c.note("answered " + key)
	}
	return func() {}, true
}

// free answers the held claims of keys (all of them without keys), once.
func (c *planClaimer) free(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(keys) == 0 {
		keys = slices.Collect(maps.Keys(c.held))
	}
	for _, k := range keys {
		if hold := c.held[k]; hold != nil {
			close(hold)
			delete(c.held, k)
		}
	}
}

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
// elector returns nil when the Plan's context ends. Each First elector
// in turn is the last one answered, so a Plan that waits for some of
// them only fails.
func TestPlanThenAfterFirst(t *testing.T) {
	t.Parallel()
	first := []string{"level.DELAYD_1S", JanitorKey}
	for _, last := range first {
		t.Run("last "+last, func(t *testing.T) {
			t.Parallel()
			planThenAfterFirst(t, first, last)
		})
	}
}

// planThenAfterFirst runs a Plan of the First electors of first and a
// router elector in Then; it answers the First electors' first bids all
// but last's first, and last's after a while.
func planThenAfterFirst(t *testing.T, first []string, last string) {
	b := setup(t)
	c := &planClaimer{held: map[string]chan struct{}{}, got: make(chan string, 16)}
	for _, k := range first {
		c.held[k] = make(chan struct{})
	}
	work := func(ctx context.Context, _ Term) error { <-ctx.Done(); return nil }
	lease := func(key string) Lease {
		e, err := New(Config{Bucket: b.bucket, Key: key, Holder: "a", TTL: testTTL, claimer: c})
		if err != nil {
			t.Fatal(err)
		}
		return Lease{e: e, work: work}
	}
	var p Plan
	for _, k := range first {
		p.First = append(p.First, lease(k))
	}
	p.Then = []Lease{lease(RouterKey)}
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

	next := func() string {
		t.Helper()
		select {
		case s := <-c.got:
			return s
		case <-time.After(time.Minute):
			t.Fatalf("no claim within a minute; claims %v", c.logCopy())
		}
		return ""
	}
	// Every First elector bids; their claims are held.
	for range first {
		if s := next(); s == "claim "+RouterKey {
			t.Fatalf("the Then elector bid before the First electors' first bids were answered: %v", c.logCopy())
		}
	}
	// The others are answered, last is still held: the Then elector must
	// not bid.
	for _, k := range first {
		if k != last {
			c.free(k)
			for !slices.Contains(c.logCopy(), "answered "+k) {
				next()
			}
		}
	}
	select {
	case s := <-c.got:
		if s == "claim "+RouterKey {
			t.Fatalf("%q while %s's first bid was unanswered: %v", s, last, c.logCopy())
		}
	case <-time.After(300 * time.Millisecond):
	}
	c.free(last)
	// Now it bids, after every First claim was answered.
	for !slices.Contains(c.logCopy(), "claim "+RouterKey) {
		next()
	}
	log := c.logCopy()
	then := slices.Index(log, "claim "+RouterKey)
	for _, k := range first {
		if a := slices.Index(log, "answered "+k); a < 0 || a > then {
			t.Fatalf("the Then elector bid before %s's first bid was answered: %s", k, strings.Join(log, ", "))
		}
	}
}
