package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/internal/natstest"
)

const testTTL = time.Second

// handoverTTL is the TTL of the tests whose subject is a hand-over before
// the fence: long enough that a renewal stalled by -race and load does not
// expire the lease and blur the fence check.
const handoverTTL = 5 * time.Second

// testBundle is one test's lease bucket on a real nats-server.
type testBundle struct {
	bucket *lease.Bucket
	js     jetstream.JetStream
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	_, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := lease.OpenBucket(ctx, js, lease.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{bucket: b, js: js}
}

// signals are one elector's typed test signals: every Event, in order.
type signals chan Event

// wait returns the next event, which must be of kind want.
func (s signals) wait(t *testing.T, want EventKind, within time.Duration) Event {
	t.Helper()
	select {
	case ev := <-s:
		if ev.Kind != want {
			t.Fatalf("%s: got event %s (%+v), want %s", ev.Key, ev.Kind, ev, want)
		}
		return ev
	case <-time.After(within):
		t.Fatalf("no %s event within %s", want, within)
	}
	return Event{}
}

// none checks that no event comes within d.
func (s signals) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev := <-s:
		t.Fatalf("%s: unexpected event %s (%+v)", ev.Key, ev.Kind, ev)
	case <-time.After(d):
	}
}

// runner is one elector running until stop, whose work records its terms.
type runner struct {
	e    *Elector
	sig  signals
	stop context.CancelFunc
	// done is closed when Run returned, with its error in err.
	done chan struct{}
	err  error
	// terms receives each term the work ran in; the work blocks until its
	// context ends, then returns workErr's value.
	terms   chan Term
	workErr chan error
}

func (b *testBundle) start(t *testing.T, key, holder string) *runner {
	t.Helper()
	return b.startTTL(t, key, holder, testTTL)
}

// startTTL is start with the lease TTL ttl.
func (b *testBundle) startTTL(t *testing.T, key, holder string, ttl time.Duration) *runner {
	t.Helper()
	r := &runner{sig: make(signals, 16), done: make(chan struct{}), terms: make(chan Term, 16), workErr: make(chan error, 1)}
	e, err := New(Config{Bucket: b.bucket, Key: key, Holder: holder, TTL: ttl, OnEvent: func(ev Event) { r.sig <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	r.e = e
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		defer close(r.done)
		r.err = e.Run(ctx, func(ctx context.Context, term Term) error {
			r.terms <- term
			select {
			case <-ctx.Done():
				return nil
			case err := <-r.workErr:
				return err
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("elector did not stop")
		}
	})
	return r
}

// TestResignHandsOver: of two electors on one key, one gains the lease and
// runs the work; when it stops, its work returns first, then it resigns,
// and the other gains the lease before the first term's fence would have
// passed: a handover, not a wait for the TTL. The epochs increase, and the
// terms do not overlap.
func TestResignHandsOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.startTTL(t, RouterKey, "A", handoverTTL)
	gainedA := a.sig.wait(t, Gained, 5*time.Second)
	termA := <-a.terms
	if !termA.Held() || termA.Epoch != gainedA.Epoch {
		t.Fatalf("A's term %+v not held or not the gained epoch %d", termA, gainedA.Epoch)
	}
	c := b.startTTL(t, RouterKey, "B", handoverTTL)
	select {
	case <-c.e.Tried(): // B's first bid was answered (not taken) at once
	case <-time.After(5 * time.Second):
		t.Fatal("B's first attempt not answered within 5 s")
	}
	c.sig.none(t, 2*time.Second) // A renews: B never gains meanwhile

	a.stop()
	<-a.done
	if a.err != nil {
		t.Fatalf("A's Run: %v", a.err)
	}
	resigned := a.sig.wait(t, Resigned, time.Second)
	gainedB := c.sig.wait(t, Gained, 2*handoverTTL)
	if termA.Held() {
		t.Error("A's term still held after A resigned")
	}
	if !gainedB.Acquired.After(resigned.ValidUntil) {
		t.Errorf("B gained at %v, not after A's validity ended at %v", gainedB.Acquired, resigned.ValidUntil)
	}
	if !gainedB.Acquired.Before(resigned.Fence) {
		t.Errorf("B gained %s after A's fence: it waited for the TTL instead of a handover", gainedB.Acquired.Sub(resigned.Fence))
	}
	if gainedB.Epoch <= gainedA.Epoch {
		t.Errorf("epochs %d then %d: want increasing", gainedA.Epoch, gainedB.Epoch)
	}
}

// TestLostWhenOverwritten: a key written under the holder (another holder's
// write) ends the term at its next renewal: the work's context ends, the
// elector announces Lost (the term ended, not resigned), and it bids again.
func TestLostWhenOverwritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := LevelKey("DELAYD_5S")
	a := b.start(t, key, "A")
	a.sig.wait(t, Gained, 5*time.Second)
	term := <-a.terms
	kv, err := b.js.KeyValue(context.Background(), lease.BucketName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), key, []byte(`{"v":1,"holder":"intruder","epoch":99}`)); err != nil {
		t.Fatal(err)
	}
	lost := a.sig.wait(t, Lost, 5*testTTL)
	if !errors.Is(lost.Cause, lease.ErrLost) {
		t.Errorf("Lost cause %v, want lease.ErrLost", lost.Cause)
	}
	if term.Held() {
		t.Error("the lost term still reads as held")
	}
	// The intruder never renews: A takes the lease back after T, at a new
	// epoch.
	again := a.sig.wait(t, Gained, 5*testTTL)
	if again.Epoch <= 99 {
		t.Errorf("epoch %d after the intruder's 99: want more", again.Epoch)
	}
}

// TestWorkStopsOnItsOwn: work that returns nil while its term is valid
// (as a scanner fenced at a failed compare-and-set does) gives the lease
// up: Lost, released (another elector takes it at once), and the first
// elector does not bid again for a TTL. A work error ends Run with it.
func TestWorkStopsOnItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.startTTL(t, RouterKey, "A", handoverTTL)
	a.sig.wait(t, Gained, 5*time.Second)
	<-a.terms
	c := b.startTTL(t, RouterKey, "B", handoverTTL)
	a.workErr <- nil
	lost := a.sig.wait(t, Lost, 5*time.Second)
	gainedB := c.sig.wait(t, Gained, 2*handoverTTL)
	if !gainedB.Acquired.Before(lost.Fence) {
		t.Errorf("B gained %s after A's fence: A did not release", gainedB.Acquired.Sub(lost.Fence))
	}
	<-c.terms
	c.workErr <- errors.New("bad setup")
	c.sig.wait(t, Lost, 5*time.Second)
	select {
	case <-c.done:
		if c.err == nil || c.err.Error() != "bad setup" {
			t.Errorf("B's Run: %v, want the work's error", c.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B's Run did not return the work's error")
	}
	a.sig.wait(t, Gained, 5*handoverTTL) // released by B: A bids again after its pause
}

// TestKeys: the lease keys, including a partition stream's.
func TestKeys(t *testing.T) {
	t.Parallel()
	for stream, want := range map[string]string{"DELAYD_5S": "level.DELAYD_5S", "DELAYD_1M-P0": "level.DELAYD_1M-P0", "DELAYD_0S": "level.DELAYD_0S"} {
		if got := LevelKey(stream); got != want {
			t.Errorf("LevelKey(%q) = %q, want %q", stream, got, want)
		}
	}
	b := setup(t)
	for _, key := range []string{RouterKey, LevelKey("DELAYD_1M-P0"), LevelKey("DELAYD_1500MS")} {
		if _, err := New(Config{Bucket: b.bucket, Key: key, Holder: "A"}); err != nil {
			t.Errorf("New(%q): %v", key, err)
		}
	}
}

// BenchmarkTermHeld measures the check a scanner makes before every
// hand-off (and the router before every level write), against a bare
// monotonic clock read as the reference in the same run:
// go test -run '^$' -bench . ./deliver/internal/ownership
func BenchmarkTermHeld(b *testing.B) {
	_, js := natstest.Connect(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bucket, err := lease.OpenBucket(ctx, js, lease.BucketConfig{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := lease.New(bucket, lease.Config{Key: RouterKey, Holder: "A"})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Acquire(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	epoch, _ := l.Held()
	term := Term{Epoch: epoch, lease: l}
	b.Run("Held", func(b *testing.B) {
		for b.Loop() {
			if !term.Held() {
				b.Fatal("term not held")
			}
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		var t time.Time
		for b.Loop() {
			t = time.Now()
		}
		_ = t
	})
}
