package cancelapi

import (
	"context"
	"sync"
	"time"

	"github.com/delayd/delayd/deliver/internal/level"
)

// lookupPacer paces the cancel API's id-index lookups so that a storm of
// cancels costs the deliveries nothing. It is a token bucket counted in
// lookup time: one lookup at a time; each spends the time it took; the
// budget refills at share seconds per second (share of one core's time,
// on the NATS server, which walks the index:
// docs/guarantees.md#what-a-cancel-costs), up to lookupBurst, and a lookup waits while the budget is
// below zero. A lone request after a quiet spell runs at once; under
// sustained load lookups take share of the time on average. Requests that
// cannot wait their turn pile up in the cancel queue and are answered
// busy ([level.ErrCancelBusy]).
//
// It owns no goroutine: the workers call acquire on their own goroutines,
// by design (one budget paces every lookup). Its fields are never written
// after newLookupPacer; what changes is the [lookupBudget], a lock-guarded
// value.
type lookupPacer struct {
	share  float64       // of one core's time, (0, 1]
	slot   chan struct{} // one lookup at a time
	budget lookupBudget
}

// lookupBudget is a lock-guarded value and nothing else: the lookup time
// that may be spent now (below zero: wait), and when it was last brought
// up to date.
type lookupBudget struct {
	mu   sync.Mutex
	left time.Duration
	at   time.Time
}

// wait brings the budget up to now at share and returns it with how long a
// lookup must wait for it to reach zero.
func (b *lookupBudget) wait(now time.Time, share float64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now, share)
	return time.Duration(float64(-b.left) / share)
}

// spend brings the budget up to end and spends a lookup from start to end.
func (b *lookupBudget) spend(start, end time.Time, share float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(end, share)
	b.left -= end.Sub(start)
}

// lookupBurst is the most lookup time the pacer lets run back to back
// after a quiet spell.
const lookupBurst = 100 * time.Millisecond

func newLookupPacer(share float64) *lookupPacer {
	return &lookupPacer{share: share, slot: make(chan struct{}, 1), budget: lookupBudget{left: lookupBurst, at: time.Now()}}
}

// refill brings the budget up to now. b.mu must be held.
func (b *lookupBudget) refill(now time.Time, share float64) {
	b.left = min(lookupBurst, b.left+time.Duration(float64(now.Sub(b.at))*share))
	b.at = now
}

// pace returns a pacer for [index.LookupPaced] that gates each read of a
// lookup, bounded by notAfter: the server's walk is spread over time in
// one read's steps instead of one lookup's.
func (g *lookupPacer) pace(notAfter time.Time) func(context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) { return g.acquire(ctx, notAfter) }
}

// acquire waits for the slot and the budget as lookup does, and returns the
// func that spends the time since and frees the slot; call it once.
func (g *lookupPacer) acquire(ctx context.Context, notAfter time.Time) (func(), error) {
	var bound <-chan time.Time
	if !notAfter.IsZero() {
		t := time.NewTimer(time.Until(notAfter))
		defer t.Stop()
		bound = t.C
	}
	select {
	case g.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-bound:
		return nil, level.ErrCancelBusy
	}
	now := time.Now()
	wait := g.budget.wait(now, g.share)
	if !notAfter.IsZero() && now.Add(wait).After(notAfter) {
		<-g.slot
		return nil, level.ErrCancelBusy
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			<-g.slot
			return nil, ctx.Err()
		}
	}
	start := time.Now()
	return func() {
		g.budget.spend(start, time.Now(), g.share)
		<-g.slot
	}, nil
}
