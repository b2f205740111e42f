//go:build long

package deliver

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/levels"
)

// TestCancelNotAnsweredAfterFence: once another writer has written a
// level's offset key since the owner's bump (as a new owner's bump would),
// the owner stores the tombstone of a cancel but does not answer
// "cancelled" in that term: the next owner may not have loaded it. The
// owner skips the message, its commit is fenced, it gives the lease up and
// takes it back with a bump of its own, loading the tombstone; only that
// term answers "cancelled" (the request is asked again meanwhile, or, if
// that takes longer than two lease TTLs, answered with an error to send it
// again). The message is never delivered.
func TestCancelNotAnsweredAfterFence(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 5 s level and a lease TTL: skipped under testing.Short()")
	}
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	// expiryTTL: A gives the lease up and takes it again after a TTL.
	a := b.start("A", expiryTTL, func(s *Service) { s.cfg.Levels = levels.MustParse(decideLevels) })
	stream := levels.MustParse(decideLevels).Levels()[1].Stream() // DELAYD_5S
	key := ownership.LevelKey(stream)
	first := a.waitEvent(t, key, ownership.Gained, 20*time.Second)
	a.svc.mu.Lock()
	sc := a.svc.parts.levels[stream]
	a.svc.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); !sc.Loaded(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's scanner not started in 20 s", stream)
		}
	}
	// The level's first message is the router's epoch marker: once the
	// scanner has passed it, its offset key exists.
	ctx := context.Background()
	kv, err := b.js.KeyValue(ctx, "DELAYD_OFFSETS")
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := kv.Get(ctx, stream); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's offset key not written in 20 s", stream)
		}
	}
	b.publishTo("tgt.f", "x", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"x"}})
	// Another writer's write of the offset key, as a new owner's bump
	// would: the same value, at the revision it read.
	for {
		e, err := kv.Get(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = kv.Update(ctx, stream, e.Value(), e.Revision()); err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			t.Fatal(err)
		}
	}
	m, err := b.nc.Request(contract.CancelSubjectFor("tgt.f"), []byte("x"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	answered, got := time.Now(), string(m.Data)
	// "cancelled" comes only from a term that began after the fence.
	next := func() (ownership.Event, bool) {
		for _, ev := range a.eventsCopy() {
			if ev.Key == key && ev.Kind == ownership.Gained && ev.Epoch > first.Epoch {
				return ev, true
			}
		}
		return ownership.Event{}, false
	}
	again, ok := next()
	switch {
	case got == contract.CancelReplyCancelled && (!ok || !again.Acquired.Before(answered)):
		t.Fatalf("answered %q by the term whose offset key another wrote (epoch %d); no later term had begun", got, first.Epoch)
	case got != contract.CancelReplyCancelled && !strings.Contains(got, "send the cancel again"):
		t.Fatalf("cancel after another writer's offset: %q, want %q from the next term or an error to send it again", got, contract.CancelReplyCancelled)
	}
	for deadline := time.Now().Add(time.Minute); !ok; again, ok = next() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not gained again within a minute (the first answer was %q)", key, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("first answer %q, %s after the next term (epoch %d) began", got, answered.Sub(again.Acquired), again.Epoch)
	m, err = b.nc.Request(contract.CancelSubjectFor("tgt.f"), []byte("x"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyCancelled {
		t.Errorf("cancel once the level was taken again: %q, %v; want %q", m.Data, err, contract.CancelReplyCancelled)
	}
	b.publishTo("tgt.f", "marker", nats.Header{contract.HeaderDuration: {"6s"}})
	if got := b.waitPayload("marker", time.Minute); contains(got, "x") {
		t.Errorf("x, its tombstone stored, was delivered: TGT holds %q", got)
	}
}
