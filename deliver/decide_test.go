package deliver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/levels"
)

// decideLevels is the decide tests' level table: level 2 waits 5 s, long
// enough to cancel or merge a message before it is due on a loaded
// machine, and short enough to see it not delivered.
const decideLevels = "1s 5s"

// splitOwners starts two replicas with the level table decideLevels: A
// bids for every level stream's lease and not the router's, B for the
// router's only. So every level is owned by A, and every request that B
// takes (a cancel, the router's merge check) needs A's decision. The TTL
// is [expiryTTL]: B bids for none of the levels, so a level A hands over to
// balance stays free until A bids for it again after the balancer's idle
// bid (2 TTLs). A table given replaces decideLevels.
func (b *ownerBundle) splitOwners(tables ...string) (a, c *replica) {
	b.t.Helper()
	text := decideLevels
	if len(tables) > 0 {
		text = tables[0]
	}
	table := func(s *Service) { s.cfg.Levels = levels.MustParse(text) }
	a = b.start("A", expiryTTL, table, func(s *Service) { s.hooks.noBid = func(key string) bool { return key == ownership.RouterKey } })
	c = b.start("B", expiryTTL, table, func(s *Service) { s.hooks.noBid = func(key string) bool { return key != ownership.RouterKey } })
	streams := []string{levels.Level{}.Stream()}
	t := levels.MustParse(text)
	for _, l := range append(t.Levels(), t.PrecisionLevels()...) {
		streams = append(streams, l.Stream())
	}
	// A liveness bound, not a property: with the package's tests in
	// parallel on a loaded machine the leases took over 20 s.
	deadline := time.Now().Add(time.Minute)
	for {
		ha, hc := a.held(), c.held()
		ok := hc[ownership.RouterKey] && len(hc) == 1
		for _, st := range streams {
			ok = ok && ha[ownership.LevelKey(st)]
		}
		delete(ha, ownership.JanitorKey) // whoever holds it: it decides nothing
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
	for i := range 3 { // B's own path: never A's scanner
		id := fmt.Sprintf("c-%d", i)
		got, err := c.svc.cancel(ctx, reader, id, "tgt.c", time.Time{})
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
	deadline := time.Now().Add(time.Minute)
	for rs, _ := c.svc.Stats(); rs.Routed < 1; rs, _ = c.svc.Stats() {
		if time.Now().After(deadline) {
			t.Fatal("B's router routed nothing in a minute")
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
	sc := a.svc.parts.levels[stream]
	a.svc.mu.Unlock()
	passed, err := strconv.ParseUint(string(m.Data), 10, 64)
	if owner := sc.Passed(); err != nil || passed == 0 || passed > owner {
		t.Errorf("passed of %s answered %q; want A's handed-off sequence (%d now), not 0 once the first was delivered", stream, m.Data, owner)
	}
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// TestMergeNotIntoRetiredCancelledHop: the router runs in replica B, the
// levels in A. A cascading message with a merge key (12 s: it waits in
// the 5 s level, then hops) is cancelled; A skips it at its hop and, once
// the offset passed it, deletes its tombstone. A later message with the
// key, before the first's due time, is not merged into the cancelled one
// (B's merge cache still places the first, and A counts a hop it passed
// as pending until its due time): it is delivered.
func TestMergeNotIntoRetiredCancelledHop(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	a, c := b.splitOwners()
	b.publishTo("tgt.h", "first", nats.Header{contract.HeaderDuration: {"12s"}, contract.HeaderMergeKey: {"k"}, contract.HeaderNatsMsgID: {"h1"}})
	reader, err := jswire.NewBatchReader(b.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	ctx := context.Background()
	var rec index.Record
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		r, ok, err := index.Lookup(ctx, reader, index.UserKey("h1"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			rec = r
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first message not placed in 20 s")
		}
	}
	if !rec.Hop {
		t.Fatalf("the first message's placement %+v does not hop", rec)
	}
	m, err := b.nc.Request(contract.CancelSubjectFor("tgt.h"), []byte("h1"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyCancelled {
		t.Fatalf("cancel of the first: %v, %v; want %q", m, err, contract.CancelReplyCancelled)
	}
	a.svc.mu.Lock()
	sc := a.svc.parts.levels[rec.Stream]
	a.svc.mu.Unlock()
	for deadline := time.Now().Add(time.Minute); sc.Cancelled(rec.Seq) || sc.Passed() < rec.Seq; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first's tombstone (sequence %d) still held a minute after the cancel (held %t, passed %d)", rec.Seq, sc.Cancelled(rec.Seq), sc.Passed())
		}
	}
	b.publishTo("tgt.h", "second", nats.Header{contract.HeaderDuration: {"1s"}, contract.HeaderMergeKey: {"k"}})
	if sent := time.Now(); !sent.Before(rec.Due) {
		t.Fatalf("the second was published at %s, after the first's due time %s: nothing tested (a loaded machine)", sent, rec.Due)
	}
	b.publishTo("tgt.h", "marker", nats.Header{contract.HeaderDuration: {"14s"}})
	got := b.waitPayload("marker", time.Minute)
	if rs, _ := c.svc.Stats(); !contains(got, "second") || contains(got, "first") {
		t.Errorf("TGT holds %q (B merged %d): want second, not merged into the cancelled first, and not first", got, rs.Merged)
	}
}

// TestCancelAnsweredAfterTombstoneRetired: a cancel whose index lookup
// found the message's placement, but whose decision comes after the
// message was cancelled by another request, skipped by its level and its
// tombstone deleted by the janitor (which first writes the "cancelled"
// index record), answers "cancelled" like the first, never "already
// delivered": the owner no longer holds the tombstone and finds the
// sequence below its next one, and the requester reads the index again
// (docs/guarantees.md#delivered-xor-cancelled). The first request is held
// between its lookup and the owner's decision by the Service's looked hook.
func TestCancelAnsweredAfterTombstoneRetired(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	looked := make(chan index.Record, 1)
	release := make(chan struct{})
	var holding atomic.Bool
	hold := func(s *Service) {
		s.cfg.Levels = levels.MustParse(decideLevels)
		s.hooks.looked = func(rec index.Record) {
			if rec.Key == index.UserKey("x") && holding.CompareAndSwap(false, true) {
				looked <- rec
				<-release
			}
		}
	}
	a := b.start("A", ownerTTL, hold)
	b.publishTo("tgt.r", "x", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"x"}})
	type reply struct {
		body string
		err  error
	}
	first := make(chan reply, 1)
	go func() {
		m, err := b.nc.Request(contract.CancelSubjectFor("tgt.r"), []byte("x"), time.Minute)
		if err != nil {
			first <- reply{err: err}
			return
		}
		first <- reply{body: string(m.Data)}
	}()
	var rec index.Record
	select {
	case rec = <-looked:
	case r := <-first:
		t.Fatalf("the first cancel was answered %q, %v before its lookup was held", r.body, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first cancel's index lookup not made in 30 s")
	}
	if rec.Gone || rec.Stream != levels.MustParse(decideLevels).Levels()[1].Stream() {
		t.Fatalf("the first cancel's lookup found %+v; want x's placement in the 5 s level", rec)
	}
	m, err := b.nc.Request(contract.CancelSubjectFor("tgt.r"), []byte("x"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyCancelled {
		close(release)
		t.Fatalf("the second cancel, while the first waits: %v, %v; want %q (it is sent 5 s before x is due)", m, err, contract.CancelReplyCancelled)
	}
	// x is skipped when due, the offset passes it, and the janitor deletes
	// its tombstone: the owner's book no longer holds it.
	a.svc.mu.Lock()
	sc := a.svc.parts.levels[rec.Stream]
	a.svc.mu.Unlock()
	for deadline := time.Now().Add(time.Minute); sc.Cancelled(rec.Seq) || sc.Passed() < rec.Seq; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("x's tombstone (sequence %d) still held a minute after the cancel (passed %d)", rec.Seq, sc.Passed())
		}
	}
	close(release)
	if r := <-first; r.err != nil || r.body != contract.CancelReplyCancelled {
		t.Errorf("the first cancel, decided after x's tombstone was deleted: %q, %v; want %q (the second was answered %q)", r.body, r.err, contract.CancelReplyCancelled, contract.CancelReplyCancelled)
	}
	b.publishTo("tgt.r", "marker", nats.Header{contract.HeaderDuration: {"6s"}})
	if got := b.waitPayload("marker", time.Minute); contains(got, "x") {
		t.Errorf("x, cancelled, was delivered: TGT holds %q", got)
	}
}

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
	if body := string(first.Data); body != level.ReplyPending && body != level.ReplyNotPending {
		t.Errorf("pending question answered %q, want %q or %q", body, level.ReplyPending, level.ReplyNotPending)
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
