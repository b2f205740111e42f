package deliver

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestListWhileDelivering: walks of a target's pages while its level
// delivers list each message at most once per walk, never list one the
// target had received before the walk began, and always list the ones
// that wait an hour (docs/pending.md §5). The level's owner stores its
// passed sequence before it hands a message off, so a delivery a
// subscriber has seen is sifted out of every later walk. Break: skip the
// sift (the walk read from the stream's start, not past the owner's
// passed, and Sifted.Pending ignoring passed): "walk 47 … listed soon-0,
// received by the target at …" (either one alone is caught by the other).
func TestListWhileDelivering(t *testing.T) {
	t.Parallel()
	const (
		target = "tgt.walk"
		soon   = 600 // Delay-Level 1 (1 s), published over about 3 s
		later  = 20  // Delay-Level 2 (1 h): pending throughout
	)
	b := setupOwners(t)
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})

	var (
		mu        sync.Mutex
		delivered = make(map[string]time.Time, soon) // id → when the subscriber had it
	)
	sub, err := b.nc.Subscribe(target, func(m *nats.Msg) {
		now := time.Now()
		mu.Lock()
		if _, ok := delivered[m.Header.Get(contract.HeaderNatsMsgID)]; !ok {
			delivered[m.Header.Get(contract.HeaderNatsMsgID)] = now
		}
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	for i := range later {
		id := fmt.Sprintf("later-%d", i)
		b.publishTo(target, id, nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {id}})
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range soon {
			id := fmt.Sprintf("soon-%d", i)
			b.publishTo(target, id, nats.Header{contract.HeaderLevel: {"1"}, contract.HeaderNatsMsgID: {id}})
			if i%20 == 19 {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()

	deliveredCount := func() int { mu.Lock(); defer mu.Unlock(); return len(delivered) }
	deadline := time.Now().Add(3 * time.Minute)
	walks, listedSoon := 0, 0
	for {
		began := time.Now()
		seen := make(map[string]int)
		for _, it := range b.listAll(target, 50) {
			seen[it.ID]++
		}
		walks++
		mu.Lock()
		for id, n := range seen {
			if n > 1 {
				t.Errorf("walk %d listed %s %d times", walks, id, n)
			}
			if at, ok := delivered[id]; ok && at.Before(began) {
				t.Errorf("walk %d (began %s) listed %s, received by the target at %s", walks, began.Format(time.StampMicro), id, at.Format(time.StampMicro))
			}
			if len(id) > 5 && id[:5] == "soon-" {
				listedSoon++
			}
		}
		mu.Unlock()
		for i := range later {
			if id := fmt.Sprintf("later-%d", i); seen[id] != 1 {
				t.Errorf("walk %d: %s listed %d times, want once", walks, id, seen[id])
			}
		}
		if t.Failed() {
			return
		}
		select {
		case <-published:
			if deliveredCount() == soon {
				if walks < 3 || listedSoon == 0 {
					t.Fatalf("%d walks listed %d pending soon-messages in all: the walks did not overlap the deliveries", walks, listedSoon)
				}
				t.Logf("%d walks while %d messages were delivered; %d listings of pending ones", walks, soon, listedSoon)
				return
			}
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d walks, %d of %d delivered", walks, deliveredCount(), soon)
		}
	}
}
