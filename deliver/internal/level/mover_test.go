package level

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// TestMoverDecision: the mover's decision for one moving intent
// (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover,
// and the crash points of #25): a stored new message is placed whatever
// the old due; without one, the old message is voided (delivered as
// usual) when it may have been handed off before the load, and the new one
// written when nobody can have handed the old one off; an unknown answer
// decides nothing.
func TestMoverDecision(t *testing.T) {
	t.Parallel()
	loaded := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		f    moveFacts
		want moveAction
	}{
		{"not known", moveFacts{known: false, exists: true, seq: 5, oldDue: loaded, loadTail: 9, loadedAt: loaded}, moveRetry},
		{"stored, old due passed (crash after N: case 4, 5)", moveFacts{known: true, exists: true, seq: 5, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, movePlace},
		{"stored, old due ahead", moveFacts{known: true, exists: true, seq: 5, oldDue: loaded.Add(time.Hour), loadTail: 9, loadedAt: loaded}, movePlace},
		{"none, old due passed before the load (case 2, 3: old, late)", moveFacts{known: true, seq: 5, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveVoid},
		{"none, old due within the second's slack", moveFacts{known: true, seq: 5, oldDue: loaded.Add(time.Second), loadTail: 9, loadedAt: loaded}, moveVoid},
		{"none, old due after the slack (case 2, 3: new)", moveFacts{known: true, seq: 5, oldDue: loaded.Add(time.Second + time.Nanosecond), loadTail: 9, loadedAt: loaded}, moveWrite},
		{"none, stored after the load: nobody else saw it", moveFacts{known: true, seq: 10, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveWrite},
		{"none, the load's last sequence", moveFacts{known: true, seq: 9, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveVoid},
	}
	for _, tt := range tests {
		if got := tt.f.action(); got != tt.want {
			t.Errorf("%s: action %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestMoverSettlesLoadedIntents: a term that loads moves left unfinished
// by an earlier owner (their intents stored, no placed marks) settles each
// as docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover says, and its head follows: a move whose new
// message is indexed elsewhere is placed (the old message never
// delivered); one with no new message whose old due passed before the
// load is voided (its intent deleted, the old message delivered, once);
// one with no new message whose old due is ahead gets its new message
// written to ingress (same payload, due at the move's due, the move's id,
// a valid hop MAC) and is placed. Deliveries come in sequence order, so
// "after" arriving shows the placed one was passed over.
func TestMoverSettlesLoadedIntents(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	// Stands in for the ingress stream: the moved message's PubAck.
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TEST_INGRESS", Subjects: []string{contract.PrefixDefault + ".tgt.>"}}); err != nil {
		t.Fatal(err)
	}
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	delivered, err := b.nc.SubscribeSync("tgt.x")
	if err != nil {
		t.Fatal(err)
	}
	rewritten, err := b.nc.SubscribeSync(contract.PrefixDefault + ".tgt.x")
	if err != nil {
		t.Fatal(err)
	}
	moveDue := time.Now().Add(2 * time.Hour).UTC()
	intents := map[string]index.Tombstone{}
	for _, m := range []struct {
		id   string
		due  time.Duration
		move bool
	}{{"place", -time.Minute, true}, {"void", -time.Minute, true}, {"after", -time.Minute, false}, {"write", time.Hour, true}} {
		h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(time.Now().Add(m.due))}, message.HdrMsgID: {m.id},
			message.HdrIngress: {"delayd-1-" + m.id}, contract.HeaderEnqueuedAt: {contract.FormatTime(time.Now())}, "User": {"u1", "u2"}}
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(m.id)})
		if err != nil {
			t.Fatal(err)
		}
		if !m.move {
			continue
		}
		it := index.Tombstone{Seq: ack.Sequence, Key: index.UserKey(m.id), Target: "tgt.x", Move: moveDue}
		tack, err := b.js.PublishMsg(ctx, it.Msg(stream))
		if err != nil {
			t.Fatal(err)
		}
		it.At = tack.Sequence
		intents[m.id] = it
	}
	// "place"'s new message was stored and routed: its latest record is
	// another placement.
	if _, err := b.js.PublishMsg(ctx, index.Record{Key: index.UserKey("place"), Stream: "DELAYD_1H", Seq: 9, Target: "tgt.x"}.Msg()); err != nil {
		t.Fatal(err)
	}
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey,
			Routed: func(context.Context) (bool, error) { return true, nil }}) // no router: nothing to wait for
	if err != nil {
		t.Fatal(err)
	}
	tctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.RunTerm(tctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	for _, want := range []string{"void", "after"} {
		m, err := delivered.NextMsg(30 * time.Second) // a liveness bound
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		if string(m.Data) != want {
			t.Fatalf("delivered %q; want %q (place is skipped, void delivered, in sequence order)", m.Data, want)
		}
	}
	tombs, err := b.js.Stream(ctx, index.CancelStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tombs.GetMsg(ctx, intents["void"].At); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the voided intent: %v; want it deleted before its message is delivered", err)
	}
	n, err := rewritten.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no moved message written for %q: %v", "write", err)
	}
	wantID := hopKey.MoveID("delayd-1-write", stream, intents["write"].Seq)
	if string(n.Data) != "write" || n.Header.Get(contract.HeaderNatsMsgID) != wantID || n.Header.Get(contract.HeaderDeliverAt) != contract.FormatTime(moveDue) ||
		len(n.Header.Values("User")) != 2 || n.Header.Get(message.HdrMsgID) != "write" || !hopKey.Valid(n.Subject, n.Header) {
		t.Fatalf("moved message %q %v; want payload write, id %s, deliver-at %s, both User values, a valid MAC", n.Data, n.Header, wantID, contract.FormatTime(moveDue))
	}
	if extra, err := rewritten.NextMsg(0); err == nil {
		t.Fatalf("a second moved message %q: only write's is rewritten", extra.Data)
	}
	for _, id := range []string{"place", "write"} {
		seq := intents[id].Seq
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if st, _, _ := l.cancel.book.state(seq); st == stateMoved {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (seq %d) not moved 30 s after the term began", id, seq)
			}
		}
	}
}
