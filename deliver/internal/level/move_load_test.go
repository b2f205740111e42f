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
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// TestLoadedMoveSkippedAndRetired: a term that loads a move's intent and
// its placed mark (the new message is stored elsewhere) skips the old
// message, never delivering it, and retires both without writing a
// "cancelled" index record for it (its new placement is its latest
// record); a placed mark whose intent is gone is deleted too. The
// message after the moved one is delivered: once it is, the moved one
// was passed over, so its absence is seen without a timed wait.
func TestLoadedMoveSkippedAndRetired(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	got, err := b.nc.SubscribeSync("tgt.x")
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	for _, id := range []string{"moved", "after"} {
		h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(time.Now().Add(-time.Minute))}, message.HdrMsgID: {id}}
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = ack.Sequence
	}
	// Moved before the term loads: its intent and its placed mark are
	// stored, and a mark of an intent deleted since.
	intent := index.Tombstone{Seq: seqs["moved"], Key: index.UserKey("moved"), Target: "tgt.x", Move: time.Now().Add(time.Hour)}
	tack, err := b.js.PublishMsg(ctx, intent.Msg(stream))
	if err != nil {
		t.Fatal(err)
	}
	var marks []uint64
	for _, p := range []index.PlacedMark{{Intent: tack.Sequence}, {Intent: tack.Sequence + 100}} {
		ack, err := b.js.PublishMsg(ctx, p.Msg(stream))
		if err != nil {
			t.Fatal(err)
		}
		marks = append(marks, ack.Sequence)
	}
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
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

	m, err := got.NextMsg(30 * time.Second) // a liveness bound
	if err != nil {
		t.Fatalf("no delivery: %v", err)
	}
	if string(m.Data) != "after" {
		t.Fatalf("delivered %q first; want only %q (the moved message is skipped)", m.Data, "after")
	}
	// A liveness bound, not a property: retired once the commit past it
	// is acknowledged.
	tombs, err := b.js.Stream(ctx, index.CancelStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range append([]uint64{tack.Sequence}, marks...) {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			_, err := tombs.GetMsg(ctx, at)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("message %d of %s still there 30 s after the term began (%v): want the move's intent and marks deleted", at, index.CancelStream, err)
			}
		}
	}
	// The retirer updates the book after its deletes.
	for deadline := time.Now().Add(30 * time.Second); l.Cancelled(seqs["moved"]); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the move still in the book 30 s after its intent and mark were deleted")
		}
	}
	reader, err := jswire.NewBatchReader(b.nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if rec, ok, err := index.Lookup(ctx, reader, intent.Key, jswire.OpTimeout); err != nil || ok {
		t.Fatalf("index record of the moved message: %+v, %v, %v; want none (a move writes no \"cancelled\" record)", rec, ok, err)
	}
}

// TestMoveAnswers: what the owner answers of a sequence moving or moved
// (docs/pending.md#21-the-decision, #23-the-book-and-the-loop): a cancel,
// status or reschedule is told to look again where the move placed it
// (AnswerForwarded, never "cancelled" or "pending" at the old place), the
// router's merge check says pending (delivered once, at one of its two
// places), and the list's sift says gone; a cancel's tombstone still
// answers cancelled and not pending.
func TestMoveAnswers(t *testing.T) {
	t.Parallel()
	l := &Level{cancel: cancelState{book: newCancelBook()}, clock: levelClock{srv: &serverClock{clock: SystemClock}}}
	o := newOwner(l, ownership.Term{}) // always held
	o.pos.next = 5                     // the moved 3 and 4 passed
	o.view.passed.Store(4)
	o.view.ready.set()
	due := time.Now().Add(time.Hour)
	l.cancel.book.load(index.Tombstone{Seq: 5, Key: "u5", Move: due, At: 1})
	l.cancel.book.load(index.Tombstone{Seq: 3, Key: "u3", Move: due, At: 2})
	l.cancel.book.placed(3, 2, 3)
	l.cancel.book.load(index.Tombstone{Seq: 7, Key: "u7", At: 4})
	for _, tt := range []struct {
		seq     uint64
		answer  CancelAnswer
		pending bool
	}{{5, AnswerForwarded, true}, {3, AnswerForwarded, true}, {7, AnswerCancelled, false}, {8, answerReserved, true}} {
		rec := index.Record{Key: "u", Stream: "DELAYD_1M", Seq: tt.seq}
		for _, op := range []AskOp{AskStatus, AskCancel} { // a cancel reserves 8
			want := tt.answer
			if want == answerReserved && op == AskStatus {
				want = AnswerPending
			}
			if d := o.reserve(rec, Ask{Op: op}); d.answer != want {
				t.Errorf("seq %d, op %d: reserve answers %d, want %d", tt.seq, op, d.answer, want)
			}
		}
		if got := o.pendingAt(rec); got != tt.pending {
			t.Errorf("seq %d: pendingAt %v, want %v", tt.seq, got, tt.pending)
		}
		if f, ok := o.siftNow([]uint64{tt.seq}); !ok || f.Pending(tt.seq) != (tt.answer == answerReserved) {
			t.Errorf("seq %d: sift %+v, %v; want pending only for the free one", tt.seq, f, ok)
		}
	}
}
