package deliver

import (
	"context"
	"sync"
	"time"

	"github.com/delayd/delayd/contract"
)

// CancelLookupShareDefault is [Config].CancelLookupShare's default: a
// tenth of one core. `delaybench -scenarios cancel-storm` (2,000 cancels/s
// at a level delivering 10,000 msg/s, 2 cores) measured the level's
// lateness p99 at 1.1× the run without cancels when lookups were all but
// off, about 2× at a quarter and 4.7× at a whole core (README "Cancel
// storm").
const CancelLookupShareDefault = contract.CancelShareDefault

// lookupGate paces the cancel API's id-index lookups so that a storm of
// cancels costs the deliveries nothing: one lookup at a time, and after a
// lookup that took d, none for d×(1/share − 1), so lookups use at most
// share of one core's time (on the NATS server, which walks the index:
// README "What a cancel costs"). Requests that cannot wait their turn pile
// up in the cancel queue and are answered busy ([ErrCancelBusy]).
//
// It guards its state with one mutex and owns no goroutine: the cancel
// workers call acquire and release on their own goroutines.
type lookupGate struct {
	share float64 // of one core's time, (0, 1]
	slot  chan struct{}

	mu   sync.Mutex
	next time.Time // no lookup starts before it
}

func newLookupGate(share float64) *lookupGate {
	return &lookupGate{share: share, slot: make(chan struct{}, 1)}
}

// acquire waits for the slot and the end of the previous lookup's pause;
// it returns ctx's error if ctx ends first. A nil error must be followed by
// release.
func (g *lookupGate) acquire(ctx context.Context) error {
	select {
	case g.slot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	wait := time.Until(g.next)
	g.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			<-g.slot
			return ctx.Err()
		}
	}
	return nil
}

// release frees the slot after a lookup that took took, and sets the pause
// before the next one.
func (g *lookupGate) release(took time.Duration) {
	g.mu.Lock()
	g.next = time.Now().Add(time.Duration(float64(took) * (1/g.share - 1)))
	g.mu.Unlock()
	<-g.slot
}

// lookup runs fn (one index lookup) through the gate.
func (g *lookupGate) lookup(ctx context.Context, fn func() error) error {
	if err := g.acquire(ctx); err != nil {
		return err
	}
	start := time.Now()
	defer func() { g.release(time.Since(start)) }()
	return fn()
}
