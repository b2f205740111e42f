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
// It guards its state with one mutex and owns no goroutine: the cancel
// workers call lookup on their own goroutines.
type lookupPacer struct {
	share float64 // of one core's time, (0, 1]
	slot  chan struct{}

	mu     sync.Mutex
	budget time.Duration // lookup time that may be spent now; below zero: wait
	at     time.Time     // when budget was last brought up to date
}

// lookupBurst is the most lookup time the pacer lets run back to back
// after a quiet spell.
const lookupBurst = 100 * time.Millisecond

func newLookupPacer(share float64) *lookupPacer {
	return &lookupPacer{share: share, slot: make(chan struct{}, 1), budget: lookupBurst, at: time.Now()}
}

// refill brings the budget up to now. g.mu must be held.
func (g *lookupPacer) refill(now time.Time) {
	g.budget = min(lookupBurst, g.budget+time.Duration(float64(now.Sub(g.at))*g.share))
	g.at = now
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
	g.mu.Lock()
	now := time.Now()
	g.refill(now)
	wait := time.Duration(float64(-g.budget) / g.share)
	g.mu.Unlock()
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
		end := time.Now()
		g.mu.Lock()
		g.refill(end)
		g.budget -= end.Sub(start)
		g.mu.Unlock()
		<-g.slot
	}, nil
}
