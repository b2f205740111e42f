package level

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// pubAckTimeout is how long a PubAck may take, counted from the publish:
// long enough that ok's PubAck is never late under -race and load; late's
// never comes, so it still times out.
const pubAckTimeout = 3 * time.Second

// outcomes produces real PubAck futures from an embedded nats-server,
// through a PubAck tracker as the scanner's (jswire.PubAcks), one kind per
// outcome the confirmation state machine must handle:
//
//   - ok: a publish stored by a stream;
//   - full: a publish refused by a stream at its limits (MaxMsgs 1,
//     discard new): the server's PubAck error, at once;
//   - gone: a publish to the subject of a deleted stream: no responders, at
//     once;
//   - late: a publish to a subject a core subscriber takes but no stream
//     stores, so no PubAck comes: the future fails with a PubAck timeout
//     only after the publish-async timeout (3 s), while it is awaited.
//
// A leader step-down cannot be produced here: a single server's streams
// have no Raft group (the step-down API needs a cluster), and a clustered
// server for a unit test would outweigh the test. Its client-visible
// outcome, a PubAck that times out or fails, is what late and full give.
type outcomes struct {
	t    *testing.T
	acks *jswire.PubAcks
}

func newOutcomes(t *testing.T, nc *nats.Conn) *outcomes {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(pubAckTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "OK", Subjects: []string{"ok.>"}, Storage: jetstream.MemoryStorage},
		{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew, Storage: jetstream.MemoryStorage},
		{Name: "GONE", Subjects: []string{"gone.>"}, Storage: jetstream.MemoryStorage},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, "full.x", nil); err != nil { // FULL is at its limit now
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "GONE"); err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync("late.>") // takes the publish, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	acks, err := jswire.NewPubAcks(nc, pubAckTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(acks.Close)
	return &outcomes{t: t, acks: acks}
}

// future publishes to kind's subject and returns its PubAck future.
func (o *outcomes) future(kind string) *jswire.PubAckFuture {
	o.t.Helper()
	f, err := o.acks.Publish(&nats.Msg{Subject: kind + ".x", Data: []byte(kind)})
	if err != nil {
		o.t.Fatal(err)
	}
	return f
}

func confirmScanner(t *testing.T) (*owner, *outcomes) {
	t.Helper()
	nc, js := natstest.Connect(t)
	store, err := offsets.New(context.Background(), js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewForTest(nc, js, Config{Stream: "DELAYD_5S", Offsets: store, Targets: target.New(nc, js, nil), Window: 4})
	if err != nil {
		t.Fatal(err)
	}
	s := newOwner(l, ownership.Term{})
	s.pos.offset, s.pos.next = 9, 15
	s.commits.Reset(9)
	return s, newOutcomes(t, nc)
}

// TestConfirmOldestLateFailure: a PubAck among the oldest half fails only
// while it is awaited (a PubAck timeout), and a later one is refused by a
// full stream. Everything in flight must be confirmed with it, the
// scanner rewound to it, and later successes remembered, so that no
// sequence is skipped and the offset never passes an undelivered message.
func TestConfirmOldestLateFailure(t *testing.T) {
	t.Parallel()
	s, o := confirmScanner(t)
	s.conf.win.inflight = []delivery{
		{seq: 10, target: "ok.x", fut: o.future("ok")},
		{seq: 11, target: "late.x", fut: o.future("late")},
		{seq: 12, target: "ok.x", fut: o.future("ok")},
		{seq: 13, target: "full.x", fut: o.future("full")},
		{seq: 14, target: "ok.x", fut: o.future("ok")},
	}
	s.confirmOldest(context.Background(), 2)
	if s.pos.offset != 10 || s.commits.Committed() != 10 {
		t.Errorf("offset %d committed %d, want 10 and 10: it must stop before the failed 11", s.pos.offset, s.commits.Committed())
	}
	if s.pos.next != 11 {
		t.Errorf("next = %d, want 11 (rewound to the first failure)", s.pos.next)
	}
	if len(s.conf.win.inflight) != 0 {
		t.Errorf("still in flight after a failure: %v", s.conf.win.inflight)
	}
	var done []uint64
	for seq := range s.conf.win.done {
		done = append(done, seq)
	}
	slices.Sort(done)
	if !slices.Equal(done, []uint64{12, 14}) {
		t.Errorf("remembered as confirmed %v, want [12 14] (13 failed and is sent again)", done)
	}
	if !s.conf.win.probing {
		t.Error("not probing after a failure")
	}
}

// TestConfirmOldestKeepsRestInFlight: with no failure, only the oldest n are
// confirmed and the rest stay in flight, in order.
func TestConfirmOldestKeepsRestInFlight(t *testing.T) {
	t.Parallel()
	s, o := confirmScanner(t)
	s.conf.win.inflight = []delivery{
		{seq: 10, target: "ok.x", fut: o.future("ok")},
		{seq: 11, target: "ok.x", fut: o.future("ok")},
		{seq: 12, target: "ok.x", fut: o.future("ok")},
		{seq: 13, target: "ok.x", fut: o.future("ok")},
	}
	s.confirmOldest(context.Background(), 2)
	if s.pos.offset != 11 {
		t.Errorf("offset = %d, want 11", s.pos.offset)
	}
	var left []uint64
	for _, d := range s.conf.win.inflight {
		left = append(left, d.seq)
	}
	if !slices.Equal(left, []uint64{12, 13}) {
		t.Errorf("left in flight %v, want [12 13]", left)
	}
	s.confirmAll(context.Background())
	if s.pos.offset != 13 || len(s.conf.win.inflight) != 0 {
		t.Errorf("after confirmAll: offset %d, in flight %d; want 13 and 0", s.pos.offset, len(s.conf.win.inflight))
	}
}

// TestConfirmDeletedTargetStream: a PubAck that fails at once with no
// responders because the target stream was deleted, and no stream captures
// the subject any more, is confirmed as a core subject without interest:
// delivered to no one, not retried, and the offset passes it. (A stream that
// exists but does not answer, electing a leader, is retried instead: that
// needs a cluster to produce; see outcomes.)
func TestConfirmDeletedTargetStream(t *testing.T) {
	t.Parallel()
	s, o := confirmScanner(t)
	s.conf.win.inflight = []delivery{
		{seq: 10, target: "ok.x", fut: o.future("ok")},
		{seq: 11, target: "gone.x", fut: o.future("gone")},
		{seq: 12, target: "ok.x", fut: o.future("ok")},
	}
	s.confirmAll(context.Background())
	if s.pos.offset != 12 || len(s.conf.win.inflight) != 0 || len(s.conf.win.done) != 0 {
		t.Errorf("offset %d, in flight %d, remembered %v; want 12, 0 and none: a target without a stream is a core subject", s.pos.offset, len(s.conf.win.inflight), s.conf.win.done)
	}
	if s.conf.win.probing {
		t.Error("probing after a confirmAll without failure")
	}
}

// TestScannerBackoffCap: docs/guarantees.md#failing-targets: the scanner's
// delivery retries back off up to 5 s (the backoff itself:
// deliver/internal/backoff's TestBackoffCapped).
func TestScannerBackoffCap(t *testing.T) {
	t.Parallel()
	if s, _ := confirmScanner(t); s.conf.backoff.Max() != 5*time.Second {
		t.Errorf("scanner retry backoff capped at %s, want 5s", s.conf.backoff.Max())
	}
}
