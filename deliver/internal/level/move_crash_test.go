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

// TestMoveCrashPoints: a worker's move ended after each step of
// docs/pending.md#22-the-writes-in-order, as a kill -9 of the owner's
// process ends it (hooks.moveStep: nothing more written, the reservation
// not released; the term is then stopped), and a new term on the same
// stream, in a new Level, finishes it as
// docs/pending.md#25-safety-delivered-once-at-the-old-due-or-once-at-the-new-one
// says. With the old due still ahead at the new term's load: before the
// intent nothing moves; after it the new message is written (once) and the
// old one is held as moved. With the old due passed: the old message is
// delivered once and no new one is written unless the new one was stored
// before the kill (then the old one is skipped). The test plays the
// router: a stored new message gets its index record before the new term.
// Deliveries come in sequence order, so "after" arriving first shows the
// old message was passed over.
func TestMoveCrashPoints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		step   int
		passed bool   // the old due passed before the new term's load
		want   string // "none": nothing moved; "old": delivered once at the old place, no N; "new": one N, the old skipped
	}{
		{"checked, before T; old due ahead", 1, false, "none"},
		{"checked, before T; old due passed", 1, true, "old"},
		{"T stored; old due ahead", 2, false, "new"},
		{"T stored; old due passed", 2, true, "old"},
		{"fenced, before N; old due ahead", 4, false, "new"},
		{"fenced, before N; old due passed", 4, true, "old"},
		{"N stored, not answered; old due ahead", 5, false, "new"},
		{"N stored, not answered; old due passed", 5, true, "new"},
		{"C stored; old due ahead", 7, false, "new"},
		{"C stored; old due passed", 7, true, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			moveCrashRow(t, tc.step, tc.passed, tc.want)
		})
	}
}

func moveCrashRow(t *testing.T, step int, passed bool, want string) {
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
	oldDue := time.Now().Add(time.Hour)
	if passed {
		oldDue = time.Now().Add(4 * time.Second)
	}
	var oldSeq uint64
	for i, id := range []string{"old", "after"} {
		h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(oldDue.Add(time.Duration(i) * 10 * time.Millisecond))}, message.HdrMsgID: {id},
			message.HdrIngress: {"delayd-1-" + id}, contract.HeaderEnqueuedAt: {contract.FormatTime(time.Now())}}
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		if id == "old" {
			oldSeq = ack.Sequence
		}
	}
	newLevel := func() *Level {
		l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
			Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey,
				Routed: func(context.Context) (bool, error) { return true, nil }}) // the test plays the router
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	runTerm := func(l *Level, epoch uint64) (stop func()) {
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = l.RunTerm(tctx, ownership.Term{Epoch: epoch})
		}()
		return func() { cancel(); <-done }
	}

	// The first term: the move ends at step.
	l1 := newLevel()
	l1.hooks.moveStep = func(s int) bool { return s == step }
	stop1 := runTerm(l1, 1)
	reader, err := jswire.NewBatchReader(b.nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rec := index.Record{Key: index.UserKey("old"), Stream: stream, Seq: oldSeq, Target: "tgt.x"}
	moveDue := time.Now().Add(2 * time.Hour).UTC()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := local{l1}.Decide(ctx, reader, rec, Ask{Op: AskReschedule, Due: moveDue})
		if errors.Is(err, errMoveKilled) {
			break
		}
		if !errors.Is(err, ownership.ErrNotOwner) || time.Now().After(deadline) {
			t.Fatalf("the move in the first term: %v; want it ended at step %d", err, step)
		}
	}
	stop1()
	if passed {
		time.Sleep(time.Until(oldDue)) // the new term loads after the old due
	}
	ingress, err := b.js.Stream(ctx, "TEST_INGRESS")
	if err != nil {
		t.Fatal(err)
	}
	moved := func() uint64 {
		info, err := ingress.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if moved() > 0 { // the router places a stored N and indexes it
		if _, err := b.js.PublishMsg(ctx, index.Record{Key: rec.Key, Stream: "DELAYD_1H", Seq: 9, Target: "tgt.x"}.Msg()); err != nil {
			t.Fatal(err)
		}
	}

	// The second term, a new process.
	l2 := newLevel()
	defer runTerm(l2, 2)()
	switch want {
	case "none":
		loaded := func() bool { o := l2.slot.get(); return o != nil && o.view.ready.done() }
		for deadline := time.Now().Add(30 * time.Second); !loaded(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the second term did not load in 30 s")
			}
		}
		if st, _, _ := l2.cancel.book.state(oldSeq); st != stateFree || moved() != 0 {
			t.Errorf("state %d, %d new messages; want the old one free and none written", st, moved())
		}
	case "old":
		for _, id := range []string{"old", "after"} {
			m, err := delivered.NextMsg(30 * time.Second) // a liveness bound
			if err != nil || string(m.Data) != id {
				t.Fatalf("delivered %v, %v; want %q (the old message delivered once, then the next)", m, err, id)
			}
		}
		if n := moved(); n != 0 {
			t.Errorf("%d new messages written; want none (the old one was delivered)", n)
		}
	case "new":
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if st, _, _ := l2.cancel.book.state(oldSeq); st == stateMoved {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the old message (seq %d) not moved 30 s after the second term began", oldSeq)
			}
		}
		if passed {
			if m, err := delivered.NextMsg(30 * time.Second); err != nil || string(m.Data) != "after" {
				t.Fatalf("delivered %v, %v; want \"after\" first (the old message skipped)", m, err)
			}
		}
		if n := moved(); n != 1 {
			t.Errorf("%d new messages stored; want exactly one", n)
		}
	}
}
