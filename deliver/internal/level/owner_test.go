package level

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestPendingWaitsForLoad: a merge question asked of this replica's owner
// while its term's load runs (readiness open) waits for the load: it
// answers "not pending" once DecidePendingWait has run out if the load
// never finishes, answers when the load finishes, and once it has,
// without a wait. A term that ends while it waits answers "not pending".
// Orderings only: past the first case the wait is an hour, so an answer
// that comes at all was caused by the load or by the term's end.
// Between terms there is no owner here: ask the one elsewhere.
func TestPendingWaitsForLoad(t *testing.T) {
	t.Parallel()
	l := &Level{
		cancel: cancelState{book: newCancelBook()},
		clock:  levelClock{srv: &serverClock{clock: SystemClock}},
	}
	ctx := context.Background()
	here := local{l}
	rec := index.Record{Key: "ix", Stream: "DELAYD_5S", Seq: 5} // not passed: pending once loaded
	if l.Owned() || here.Pending(ctx, rec) {
		t.Fatal("Pending between terms: owned or pending, want no owner here")
	}
	o := newOwner(l, ownership.Term{Epoch: 1})
	o.view.passed.Store(3) // as a load sets it
	l.slot.begin(o)

	// The load never finishes.
	start := time.Now()
	pending, owned := here.Pending(ctx, rec), l.Owned()
	if took := time.Since(start); !owned || pending || took < DecidePendingWait {
		t.Fatalf("Pending during a load that never finishes: pending %v owned %v after %s; want false, true after at least %s",
			pending, owned, took, DecidePendingWait)
	}

	// From here on the wait cannot run out (an hour): an answer that comes
	// at all came from the load, or from the term's end.
	l.hooks.pendingWait = time.Hour

	// The load finishes while it waits: "pending", after the load.
	setAt := make(chan time.Time, 1)
	go func() {
		time.Sleep(DecidePendingWait / 5)
		setAt <- time.Now()
		o.view.ready.set()
	}()
	pending, owned = answerWithin(t, func() bool { return here.Pending(ctx, rec) }), l.Owned()
	answered := time.Now()
	set := <-setAt
	if !owned || !pending || answered.Before(set) {
		t.Fatalf("Pending while the load finishes: pending %v owned %v, answered %s after the load finished; want true, true, after it",
			pending, owned, answered.Sub(set))
	}

	// Loaded: answered without a wait.
	pending, owned = answerWithin(t, func() bool { return here.Pending(ctx, rec) }), l.Owned()
	if !owned || !pending {
		t.Fatalf("Pending once loaded: pending %v owned %v; want true, true", pending, owned)
	}
	if passed, owned := here.Passed(ctx, rec.Stream), l.Owned(); passed != 3 || !owned {
		t.Fatalf("Passed once loaded: %d, %v; want 3, true", passed, owned)
	}

	// A reload (readiness reset) waits again; the term's end answers it.
	o.view.ready.reset()
	if passed, owned := here.Passed(ctx, rec.Stream), l.Owned(); passed != 0 || !owned {
		t.Fatalf("Passed during a reload: %d, %v; want 0 (not loaded), true", passed, owned)
	}
	go func() {
		time.Sleep(DecidePendingWait / 5)
		close(o.done)
	}()
	pending, owned = answerWithin(t, func() bool { return here.Pending(ctx, rec) }), l.Owned()
	if !owned || pending {
		t.Fatalf("Pending as the term ends during a reload: pending %v owned %v; want false, true", pending, owned)
	}
	l.slot.end(o)
	if l.Owned() || here.Pending(ctx, rec) {
		t.Fatal("Pending after the term: owned or pending, want no owner here")
	}
}

// answerWithin returns ask's answer, failing the test if it has none
// within a minute: a liveness bound, far beyond any wait ask can have
// but the hour the test sets, never a timing property.
func answerWithin(t *testing.T, ask func() bool) bool {
	t.Helper()
	ch := make(chan bool, 1)
	go func() { ch <- ask() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("no answer within a minute: it waited for its (hour-long) wait to run out")
		return false
	}
}

// TestOwnerFreshPerTerm runs two terms of one Level: each term's owner is
// built fresh (its groups empty, its channels its own) and dropped when
// the term ends, while what outlives a term stays in the Level: here a
// cancel's reservation in the book (docs/reshape.md R5) and the last
// term's epoch (R8).
func TestOwnerFreshPerTerm(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	runTerm := func(epoch uint64) (o *owner, stop func()) {
		t.Helper()
		tctx, tcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = l.RunTerm(tctx, ownership.Term{Epoch: epoch})
		}()
		for !l.Loaded() {
			if ctx.Err() != nil {
				t.Fatalf("term %d: not loaded in time", epoch)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return l.slot.get(), func() { tcancel(); <-done }
	}

	o1, stop1 := runTerm(1)
	// A cancel reserves a sequence the level has not reached (the loop's
	// side of it, as reserve does), and its I/O outlasts the term.
	r := l.cancel.book.reserve(7, time.Now().Add(time.Minute))
	stop1()
	select {
	case <-o1.done:
	default:
		t.Fatal("term 1 ended, its owner's done is open")
	}
	if l.Owned() || l.Loaded() || l.slot.get() != nil || l.Stats().Owner {
		t.Fatal("between terms: the slot still holds an owner")
	}
	if e := l.Stats().Epoch; e != 1 {
		t.Fatalf("between terms: epoch %d, want 1 (the last term's)", e)
	}
	if o1.pos.next == 0 || o1.life.stream == nil || o1.io.reader == nil {
		t.Fatalf("term 1's owner never loaded: next %d, stream %v", o1.pos.next, o1.life.stream)
	}

	// A fresh owner's groups are empty, its channels new.
	f := newOwner(l, ownership.Term{Epoch: 2})
	if f.pos != (position{}) || f.life != (streamLife{}) || f.head != (headState{}) || f.io != (ioSet{}) ||
		f.fenced.Load() || f.view.passed.Load() != 0 || f.view.ready.done() || len(f.conf.win.inflight) != 0 {
		t.Fatalf("a new owner's groups are not empty: pos %+v life %+v head %+v io %+v fenced %v passed %d ready %v in flight %d",
			f.pos, f.life, f.head, f.io, f.fenced.Load(), f.view.passed.Load(), f.view.ready.done(), len(f.conf.win.inflight))
	}

	o2, stop2 := runTerm(2)
	if o2 == o1 || o2.asks == o1.asks || o2.wake == o1.wake || o2.done == o1.done || o2.conf.win == o1.conf.win {
		t.Fatal("term 2 runs term 1's owner, or shares its channels or window")
	}
	// Term 2's load kept the reservation: the cancel is still in flight.
	if _, tombstoned, got := l.cancel.book.lookup(7); got != r || tombstoned {
		t.Fatalf("term 2: the book's reservation of 7 is %v (tombstoned %v), want term 1's %v", got, tombstoned, r)
	}
	select {
	case <-r.done:
		t.Fatal("term 2: the reservation of 7 ended")
	default:
	}
	stop2()
	if o2.io.reader == o1.io.reader || o2.pos.next == 0 {
		t.Fatal("term 2's owner shares term 1's reader, or never loaded")
	}
	l.cancel.book.release(r)
}

// TestAnswersOnlyWhileOwned: an owner answers the merge questions (Pending,
// Passed, and the decide server's pendingNow and passedNow) only while it
// owns the level. Once its lease term has ended, or it was fenced, it may
// still be in the term slot until its loop returns; it then answers as no
// owner does ("not pending", 0), never from a view going stale.
func TestAnswersOnlyWhileOwned(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bucket, err := lease.OpenBucket(ctx, js, lease.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const stream = "DELAYD_5S"
	e, err := ownership.New(ownership.Config{Bucket: bucket, Key: ownership.LevelKey(stream), Holder: lease.NewHolderID()})
	if err != nil {
		t.Fatal(err)
	}
	terms := make(chan ownership.Term, 1)
	ectx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() {
		ran <- e.Run(ectx, func(wctx context.Context, term ownership.Term) error {
			terms <- term
			<-wctx.Done()
			return nil
		})
	}()
	var term ownership.Term
	select {
	case term = <-terms:
	case <-ctx.Done():
		t.Fatal("no lease term gained")
	}

	rec := index.Record{Key: "ix", Stream: stream, Seq: 5} // not passed: pending
	ask := func(l *Level, o *owner) (pending, pendingNow bool, passed, passedNow uint64) {
		here := local{l}
		return here.Pending(ctx, rec), o.pendingNow(rec), here.Passed(ctx, stream), o.passedNow()
	}
	newLoaded := func(term ownership.Term) (*Level, *owner) {
		l := &Level{
			cancel: cancelState{book: newCancelBook()},
			clock:  levelClock{srv: &serverClock{clock: SystemClock}},
		}
		o := newOwner(l, term)
		o.view.passed.Store(3) // as a load sets it
		o.view.ready.set()
		l.slot.begin(o)
		return l, o
	}

	l, o := newLoaded(term)
	if p, pn, s, sn := ask(l, o); !p || !pn || s != 3 || sn != 3 {
		t.Fatalf("while the term is held: pending %v, pendingNow %v, passed %d, passedNow %d; want true, true, 3, 3", p, pn, s, sn)
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if term.Held() {
		t.Fatal("the term is still held after its elector stopped")
	}
	if p, pn, s, sn := ask(l, o); !l.Owned() || p || pn || s != 0 || sn != 0 {
		t.Fatalf("after the term ended, still in the slot (owned %v): pending %v, pendingNow %v, passed %d, passedNow %d; want false, false, 0, 0",
			l.Owned(), p, pn, s, sn)
	}

	// Fenced: the zero Term is always held, the fence alone stops it.
	l, o = newLoaded(ownership.Term{})
	o.fenced.Store(true) // as fence sets it on a commit refused as fenced
	if p, pn, s, sn := ask(l, o); !l.Owned() || p || pn || s != 0 || sn != 0 {
		t.Fatalf("fenced, still in the slot (owned %v): pending %v, pendingNow %v, passed %d, passedNow %d; want false, false, 0, 0",
			l.Owned(), p, pn, s, sn)
	}
}
