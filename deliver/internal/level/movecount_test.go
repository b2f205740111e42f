package level

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// TestMoveCount: the new message of a move carries the old message's move
// count plus one (Delayd-Moves: 1 for a message never moved, 3 for one
// moved twice), covered by its hop MAC; a cascade's forward (buildHop)
// keeps the count as it is (docs/pending.md#22-the-writes-in-order).
func TestMoveCount(t *testing.T) {
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
	rewritten, err := b.nc.SubscribeSync(contract.PrefixDefault + ".tgt.x")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	moveDue := time.Now().Add(time.Hour).UTC()
	for _, tc := range []struct{ had, want string }{{"", "1"}, {"2", "3"}} {
		h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(time.Now().Add(time.Minute))}, message.HdrMsgID: {"m" + tc.had},
			message.HdrIngress: {"delayd-1-9"}, contract.HeaderEnqueuedAt: {contract.FormatTime(time.Now())}}
		if tc.had != "" {
			h[message.HdrOrigin], h[message.HdrHops], h[message.HdrMoves] = []string{"delayd-1-7"}, []string{"1"}, []string{tc.had}
		}
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte("p")})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := st.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		old := &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
		if err := l.writeMoved(ctx, old, index.Tombstone{Seq: ack.Sequence, Key: index.UserKey("m" + tc.had), Target: "tgt.x", Move: moveDue}); err != nil {
			t.Fatal(err)
		}
		n, err := rewritten.NextMsg(30 * time.Second) // a liveness bound
		if err != nil {
			t.Fatalf("no moved message for a move count of %q: %v", tc.had, err)
		}
		if got := n.Header.Get(message.HdrMoves); got != tc.want || !hopKey.Valid(n.Subject, n.Header) {
			t.Fatalf("moved message of a message with Delayd-Moves %q: Delayd-Moves %q (valid MAC %v), want %q and a valid MAC",
				tc.had, got, hopKey.Valid(n.Subject, n.Header), tc.want)
		}
		// The next cascade hop of the moved message keeps the count.
		fh := n.Header
		buildHop(fh, fh.Get(message.HdrOrigin), 2, moveDue)
		if got := fh.Get(message.HdrMoves); got != tc.want {
			t.Errorf("a forward of a message with Delayd-Moves %q carries %q", tc.want, got)
		}
	}
}
