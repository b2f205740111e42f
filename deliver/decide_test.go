package deliver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/leadership"
	"github.com/delayd/delayd/levels"
)

// decideLevels is the decide tests' level table: level 2 waits 5 s, long
// enough to cancel or merge a message before it is due on a loaded
// machine, and short enough to see it not delivered.
const decideLevels = "1s 5s"

// splitOwners starts two replicas with the level table decideLevels: A
// bids for every level stream's lease and not the router's, B for the
// router's only. So every level is owned by A, and every request that B
// takes (a cancel, the router's merge check) needs A's decision.
func (b *ownerBundle) splitOwners() (a, c *replica) {
	b.t.Helper()
	table := func(s *Service) { s.cfg.Levels = levels.MustParse(decideLevels) }
	a = b.start("A", ownerTTL, table, func(s *Service) { s.noBid = func(key string) bool { return key == leadership.RouterKey } })
	c = b.start("B", ownerTTL, table, func(s *Service) { s.noBid = func(key string) bool { return key != leadership.RouterKey } })
	streams := []string{levels.Level{}.Stream()}
	t := levels.MustParse(decideLevels)
	for _, l := range append(t.Levels(), t.PrecisionLevels()...) {
		streams = append(streams, l.Stream())
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ha, hc := a.held(), c.held()
		ok := hc[leadership.RouterKey] && len(hc) == 1
		for _, st := range streams {
			ok = ok && ha[leadership.LevelKey(st)]
		}
		delete(ha, leadership.JanitorKey) // whoever holds it: it decides nothing
		if ok && len(ha) == len(streams) {
			return a, c
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("A holds %v, B holds %v: want every level A's, the router B's", ha, hc)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// publishTo publishes one message to delay.<target> through JetStream
// with headers h and waits for its PubAck.
func (b *ownerBundle) publishTo(target, payload string, h nats.Header) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "delay." + target, Data: []byte(payload), Header: h}); err != nil {
		b.t.Fatalf("publish %s: %v", payload, err)
	}
}

// targetPayloads returns the payloads TGT holds, in order.
func (b *ownerBundle) targetPayloads() []string {
	b.t.Helper()
	ctx := context.Background()
	tgt, err := b.js.Stream(ctx, "TGT")
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := tgt.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := tgt.GetMsg(ctx, seq)
		if err != nil {
			b.t.Fatalf("TGT sequence %d: %v", seq, err)
		}
		out = append(out, string(m.Data))
	}
	return out
}

// waitPayload waits until TGT holds payload, and returns what it holds.
func (b *ownerBundle) waitPayload(payload string, within time.Duration) []string {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := b.targetPayloads()
		for _, p := range got {
			if p == payload {
				return got
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("TGT does not hold %q after %s; it holds %q", payload, within, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCancelDecidedByOwner: with every level owned by replica A, cancels
// taken by replica B (which owns no level) are decided by A through the
// level's decide subject: each answers "cancelled" (B's own cancel path
// for three messages, the cancel API, whichever replica its queue group
// picks, for three more), and none of the six is ever delivered, while
// six messages published with them, and a later marker, are.
func TestCancelDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	_, c := b.splitOwners()
	for i := range 6 {
		b.publishTo("tgt.c", fmt.Sprintf("c-%d", i), nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {fmt.Sprintf("c-%d", i)}})
		b.publishTo("tgt.c", fmt.Sprintf("k-%d", i), nats.Header{contract.HeaderLevel: {"2"}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	js, err := jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // B's own path: never A's scanner
		id := fmt.Sprintf("c-%d", i)
		got, err := c.svc.cancel(ctx, js, reader, id, "tgt.c", time.Time{})
		if err != nil || got != contract.CancelReplyCancelled {
			t.Errorf("cancel %s through B (no level owned): %q, %v; want %q", id, got, err, contract.CancelReplyCancelled)
		}
	}
	for i := 3; i < 6; i++ { // the API: either replica
		id := fmt.Sprintf("c-%d", i)
		m, err := b.nc.Request(contract.CancelSubjectFor("tgt.c"), []byte(id), 30*time.Second)
		if err != nil || string(m.Data) != contract.CancelReplyCancelled {
			var body string
			if m != nil {
				body = string(m.Data)
			}
			t.Errorf("cancel %s through the API: %q, %v; want %q", id, body, err, contract.CancelReplyCancelled)
		}
	}
	// A marker due after the twelve: once it is delivered, so were they,
	// unless cancelled.
	b.publishTo("tgt.c", "marker", nats.Header{contract.HeaderDuration: {"6s"}})
	got := b.waitPayload("marker", time.Minute)
	for i := range 6 {
		if !contains(got, fmt.Sprintf("k-%d", i)) {
			t.Errorf("k-%d (not cancelled) was not delivered before the later marker: TGT holds %q", i, got)
		}
		if contains(got, fmt.Sprintf("c-%d", i)) {
			t.Errorf("c-%d, cancelled, was delivered: TGT holds %q", i, got)
		}
	}
}

// TestMergeAcrossReplicas: the router runs in replica B and the level
// stream in replica A. A second message with the merge key of a pending
// first is merged into it: the router asked A, the level's owner, whether
// the first is pending. Only the first payload is delivered. Then the
// level's decide subject answers "passed" (the router's placed check for
// a hop purged from the level) with A's handed-off sequence: not 0 once
// the first was delivered from it.
func TestMergeAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	a, c := b.splitOwners()
	h := func() nats.Header {
		return nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderMergeKey: {"user-42"}}
	}
	b.publishTo("tgt.m", "first", h())
	// The first is in its level (A's) before the second arrives.
	deadline := time.Now().Add(20 * time.Second)
	for rs, _ := c.svc.Stats(); rs.Routed < 1; rs, _ = c.svc.Stats() {
		if time.Now().After(deadline) {
			t.Fatal("B's router routed nothing in 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.publishTo("tgt.m", "second", h())
	b.publishTo("tgt.m", "marker", nats.Header{contract.HeaderDuration: {"6s"}})
	got := b.waitPayload("marker", time.Minute)
	if !contains(got, "first") || contains(got, "second") {
		t.Errorf("TGT holds %q: want the first payload only, the second merged into it", got)
	}
	if rs, _ := c.svc.Stats(); rs.Merged != 1 {
		t.Errorf("B's router merged %d messages, want 1", rs.Merged)
	}
	stream := levels.MustParse(decideLevels).Levels()[1].Stream()
	m, err := b.nc.Request(contract.DecideSubject(stream), []byte(`{"op":"passed"}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a.svc.mu.Lock()
	sc := a.svc.scanners[stream]
	a.svc.mu.Unlock()
	passed, err := strconv.ParseUint(string(m.Data), 10, 64)
	if owner := sc.passed.Load(); err != nil || passed == 0 || passed > owner {
		t.Errorf("passed of %s answered %q; want A's handed-off sequence (%d now), not 0 once the first was delivered", stream, m.Data, owner)
	}
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// TestDecideSubjectOwnerOnly: only the level's owner serves its decide
// subject; a request that is not JSON with an op, a key and a sequence is
// answered with an error text, not dropped.
func TestDecideSubjectOwnerOnly(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.splitOwners()
	stream := levels.MustParse(decideLevels).Levels()[1].Stream()
	m, err := b.nc.Request(contract.DecideSubject(stream), []byte("hello"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(m.Data), contract.CancelReplyErrorPrefix+"bad decide request") {
		t.Errorf("garbled request answered %q, want an error text", m.Data)
	}
	// Exactly one replica answers: gather replies for a moment.
	inbox := b.nc.NewInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.nc.PublishRequest(contract.DecideSubject(stream), inbox, []byte(`{"op":"pending","key":"uX","seq":1}`)); err != nil {
		t.Fatal(err)
	}
	first, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if body := string(first.Data); body != decidePending && body != decideNotPending {
		t.Errorf("pending question answered %q, want %q or %q", body, decidePending, decideNotPending)
	}
	if extra, err := sub.NextMsg(time.Second); err == nil {
		t.Errorf("a second replica answered on %s: %q", contract.DecideSubject(stream), extra.Data)
	}
	// The owner's handed-off sequence, for the router's placed check: a
	// decimal number (0: nothing delivered from the level yet).
	m, err = b.nc.Request(contract.DecideSubject(stream), []byte(`{"op":"passed"}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strconv.ParseUint(string(m.Data), 10, 64); err != nil {
		t.Errorf("passed answered %q, want a sequence", m.Data)
	}
}

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
	a := b.start("A", ownerTTL, func(s *Service) { s.cfg.Levels = levels.MustParse(decideLevels) })
	stream := levels.MustParse(decideLevels).Levels()[1].Stream() // DELAYD_5S
	key := leadership.LevelKey(stream)
	first := a.waitEvent(t, key, leadership.Gained, 20*time.Second)
	a.svc.mu.Lock()
	sc := a.svc.scanners[stream]
	a.svc.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); !sc.decides.Load(); time.Sleep(5 * time.Millisecond) {
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
	next := func() (leadership.Event, bool) {
		for _, ev := range a.eventsCopy() {
			if ev.Key == key && ev.Kind == leadership.Gained && ev.Epoch > first.Epoch {
				return ev, true
			}
		}
		return leadership.Event{}, false
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
