package deliver

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// TestInfoAnswersThroughDrain: a stopping Service answers the info API
// until its Run returns, through a graceful stop's drain (held here at
// the first lease's resignation, which comes after the group's context
// ended), and nothing answers once Run has returned.
func TestInfoAnswersThroughDrain(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	resigning, release := make(chan struct{}), make(chan struct{})
	var resigned, released sync.Once
	r := b.start("a", 0, func(s *Service) {
		record := s.hooks.onLease
		s.hooks.onLease = func(ev ownership.Event) {
			record(ev)
			if ev.Kind == ownership.Resigned {
				resigned.Do(func() { close(resigning) })
				<-release
			}
		}
	})
	t.Cleanup(func() { released.Do(func() { close(release) }) }) // before start's cleanup waits for Run
	r.waitEvent(t, ownership.JanitorKey, ownership.Gained, time.Minute)

	r.stop()
	select {
	case <-resigning:
	case <-r.done:
		t.Fatalf("Run returned (%v) without resigning a lease", r.err)
	case <-time.After(time.Minute):
		t.Fatal("no lease resigned within a minute of the stop")
	}
	_, err := b.nc.Request(contract.InfoSubject, nil, 10*time.Second)
	released.Do(func() { close(release) })
	if err != nil {
		t.Errorf("info request during the drain: %v", err)
	}
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of the stop")
	}
	if err := r.nc.Flush(); err != nil { // the Service's unsubscribe, to the server
		t.Fatal(err)
	}
	if _, err := b.nc.Request(contract.InfoSubject, nil, 10*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("info request after Run returned: %v, want no responders", err)
	}
}
