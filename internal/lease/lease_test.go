package lease

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// testBundle is one test's bucket on a real nats-server, and a direct
// handle on its key-value store.
type testBundle struct {
	bucket *Bucket
	kv     jetstream.KeyValue
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	_, js := natstest.Connect(t)
	b, err := OpenBucket(testCtx(t, 10*time.Second), js, BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{bucket: b, kv: b.kv}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newLease returns a lease on key for holder, released when the test ends.
func newLease(t *testing.T, b *Bucket, key, holder string, ttl, margin time.Duration) *Lease {
	t.Helper()
	l, err := New(b, Config{Key: key, Holder: holder, TTL: ttl, Margin: margin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
	return l
}

func acquire(t *testing.T, l *Lease, within time.Duration) {
	t.Helper()
	if err := l.Acquire(testCtx(t, within)); err != nil {
		t.Fatalf("%s: Acquire: %v", l.holder, err)
	}
}

// waitEnded waits until l's term ended and returns it.
func waitEnded(t *testing.T, l *Lease, within time.Duration) TermInfo {
	t.Helper()
	select {
	case <-l.Context().Done():
	case <-time.After(within):
		t.Fatalf("%s: term still running after %s", l.holder, within)
	}
	return l.LastTerm()
}

// TestTwoContendersOneHolds: two replicas acquire one lease at once; one
// holds it, and while it renews the other never does. At no instant are
// both valid, and if the other ever takes over, its term begins after the
// first one's ended.
func TestTwoContendersOneHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Second
	ls := []*Lease{newLease(t, b.bucket, "router", "A", ttl, 0), newLease(t, b.bucket, "router", "B", ttl, 0)}
	ctx := testCtx(t, 4*ttl)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, l := range ls {
		wg.Go(func() { errs[i] = l.Acquire(ctx) })
	}
	// Sample both while they contend for 4 T.
	sampled := 0
	for ctx.Err() == nil {
		_, v0 := ls[0].Held()
		_, v1 := ls[1].Held()
		if v0 && v1 {
			t.Fatalf("both hold the lease: %+v and %+v", ls[0].LastTerm(), ls[1].LastTerm())
		}
		if v0 || v1 {
			sampled++
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if sampled == 0 {
		t.Fatal("neither contender ever held the lease")
	}
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: %v", err)
		}
	}
	t0, t1 := ls[0].LastTerm(), ls[1].LastTerm()
	switch won {
	case 1:
	case 2:
		// Legitimate only as a takeover after the first term ended (the
		// holder missed its renewals on a loaded machine).
		first, second := t0, t1
		if second.Acquired.Before(first.Acquired) {
			first, second = second, first
		}
		if !first.Ended || !first.ValidUntil.Before(second.Acquired) || second.Epoch <= first.Epoch {
			t.Fatalf("both acquired with overlapping terms: %+v and %+v", first, second)
		}
		t.Logf("the first holder's term ended (%v) and the other took over", first.Cause)
	default:
		t.Fatalf("Acquire results %v: want exactly one holder", errs)
	}
}

// TestPausedHolderTakeover: a holder that stops renewing (paused) keeps its
// lease until its fence, and a contender takes it only after T of
// unchanged revision: the contender's term begins at least T after the
// paused holder's last renewal was sent, and after the paused holder's
// validity ended. The new epoch is the old one + 1.
func TestPausedHolderTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Second
	a := newLease(t, b.bucket, "level.DELAYD_5S", "A", ttl, 0)
	c := newLease(t, b.bucket, "level.DELAYD_5S", "B", ttl, 0)
	acquire(t, a, 5*time.Second)
	taken := make(chan error, 1)
	go func() { taken <- c.Acquire(testCtx(t, 20*time.Second)) }()

	a.PauseRenewals(true)
	if err := <-taken; err != nil {
		t.Fatalf("B never took the paused holder's lease: %v", err)
	}
	old, next := a.LastTerm(), c.LastTerm()
	if _, valid := a.Held(); valid {
		t.Fatalf("A still valid after B took over: A %+v, B %+v", old, next)
	}
	if !errors.Is(old.Cause, ErrExpired) {
		t.Fatalf("A's term ended with %v, want ErrExpired", old.Cause)
	}
	lastSent := old.ValidUntil.Add(-ttl + a.Margin()) // the fence is last send + T - margin
	if got := next.Acquired.Sub(lastSent); got < ttl {
		t.Fatalf("B took over %s after A's last renewal was sent, want at least T = %s", got, ttl)
	}
	if !old.ValidUntil.Before(next.Acquired) {
		t.Fatalf("A valid until %s after B's term began (A's fence - B's start = %s)", old.ValidUntil.Format(time.StampMicro), old.ValidUntil.Sub(next.Acquired))
	}
	if next.Epoch != old.Epoch+1 {
		t.Fatalf("epochs %d then %d, want +1", old.Epoch, next.Epoch)
	}
}

// TestHeldExactPastDeadline: Held reads the clock, so it is false from the
// fence on even when the expiry timer has not ended the term (a timer that
// fires late, as in a busy or paused process): with renewals paused and
// the timer held back, the term is still running past Deadline, and Held
// must say it is not valid. Once the timer is let go, the term ends with
// ErrExpired.
func TestHeldExactPastDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Second
	a := newLease(t, b.bucket, "router", "A", ttl, 0)
	acquire(t, a, 5*time.Second)
	a.PauseRenewals(true)
	a.HoldExpiry(true)
	epoch, valid := a.Held()
	fence, ok := a.Deadline()
	if !valid || !ok {
		t.Fatalf("just acquired: Held() = %d, %v; Deadline() = %v, %v; want valid", epoch, valid, fence, ok)
	}
	for !time.Now().After(fence) {
		time.Sleep(time.Until(fence) + time.Millisecond)
	}
	gotEpoch, valid := a.Held()
	after, ok := a.Deadline()
	switch {
	case !ok || !after.Equal(fence):
		t.Fatalf("the term ended or moved its fence with renewals paused and the timer held: Deadline() = %v, %v, want %v", after, ok, fence)
	case a.Context().Err() != nil:
		t.Fatalf("the term's context ended with the expiry timer held: %v", context.Cause(a.Context()))
	case valid:
		t.Fatalf("Held() = %d, true %s past Deadline(), with the expiry timer held back: want false from the fence on", gotEpoch, time.Since(fence))
	case gotEpoch != epoch:
		t.Fatalf("Held() epoch %d past the fence, want the term's %d", gotEpoch, epoch)
	}
	a.HoldExpiry(false)
	if info := waitEnded(t, a, 5*time.Second); !errors.Is(info.Cause, ErrExpired) {
		t.Fatalf("term ended with %v once the timer was let go, want ErrExpired", info.Cause)
	}
}

// TestFailedCASLosesAtOnce: when another writer changes the key, the
// holder's next renewal fails its compare-and-set and the term ends at
// once with ErrLost, long before its fence.
func TestFailedCASLosesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = 3 * time.Second
	a := newLease(t, b.bucket, "janitor", "A", ttl, 0)
	acquire(t, a, 5*time.Second)
	if _, err := b.kv.Put(testCtx(t, 5*time.Second), "janitor", Value{Holder: "intruder", Epoch: 99}.encode()); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	fence, _ := a.Deadline()
	end := waitEnded(t, a, 2*ttl)
	if !errors.Is(end.Cause, ErrLost) || !errors.Is(end.Cause, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("term ended with %v, want ErrLost wrapping the revision mismatch", end.Cause)
	}
	if !end.ValidUntil.Before(fence) {
		t.Fatalf("term valid until its fence (%s after the foreign write), not ended at the failed renewal", end.ValidUntil.Sub(written))
	}
	if _, valid := a.Held(); valid {
		t.Fatal("Held reports valid after the loss")
	}
}

// TestOwnExpiredLeaseRetakenAtOnce: a holder whose term expired because
// its renewals went unanswered (a bucket leader being elected; here they
// are paused) takes its lease back on its first attempt, at the next
// epoch, when the key still holds its own value: nobody else can have
// started a term without writing the key. A contender waits T as before,
// and loses the compare-and-set race. Without the rule, the first
// attempt after the expiry returns false (it starts the T wait).
func TestOwnExpiredLeaseRetakenAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = 2 * time.Second
	a := newLease(t, b.bucket, "level.DELAYD_1M", "A", ttl, 0)
	c := newLease(t, b.bucket, "level.DELAYD_1M", "B", ttl, 0)
	acquire(t, a, 5*time.Second)
	first := a.LastTerm()
	if ok, err := c.TryAcquire(testCtx(t, 5*time.Second)); ok || err != nil {
		t.Fatalf("B took a held lease: %v %v", ok, err)
	}

	a.PauseRenewals(true)
	end := waitEnded(t, a, 3*ttl)
	if !errors.Is(end.Cause, ErrExpired) {
		t.Fatalf("A's term ended with %v, want ErrExpired", end.Cause)
	}
	a.PauseRenewals(false)
	ok, err := a.TryAcquire(testCtx(t, 5*time.Second))
	if err != nil || !ok {
		t.Fatalf("A's first attempt after its term expired: %v %v, want its own lease back at once", ok, err)
	}
	next := a.LastTerm()
	if next.Epoch != first.Epoch+1 || !end.ValidUntil.Before(next.Acquired) {
		t.Fatalf("A's terms %+v then %+v: want the next epoch, beginning after the old term's validity", end, next)
	}
	if ok, err := c.TryAcquire(testCtx(t, 5*time.Second)); ok || err != nil {
		t.Fatalf("B took the lease A holds again: %v %v", ok, err)
	}

	// Once another holder wrote the key, A waits like any contender.
	a.PauseRenewals(true)
	waitEnded(t, a, 3*ttl)
	if err := c.Acquire(testCtx(t, 20*time.Second)); err != nil {
		t.Fatalf("B never took A's expired lease: %v", err)
	}
	a.PauseRenewals(false)
	if ok, err := a.TryAcquire(testCtx(t, 5*time.Second)); ok || err != nil {
		t.Fatalf("A took back a lease B holds: %v %v", ok, err)
	}
}

// TestReleaseWhileWatchStarts: a release made after a contender's first
// read but before its watch exists (creating the watch's consumer can be
// slow) is still taken at once: the contender reads again once its watch
// is ready. T is a minute, so a contender left to its TTL/3 poll (20 s)
// fails the test's 10 s wait.
func TestReleaseWhileWatchStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Minute
	a := newLease(t, b.bucket, "router", "A", ttl, 0)
	c := newLease(t, b.bucket, "router", "B", ttl, 0)
	acquire(t, a, 5*time.Second)
	releaseWatch := c.HoldWatch()
	taken := make(chan error, 1)
	go func() { taken <- c.Acquire(testCtx(t, 30*time.Second)) }()
	// B's first read sees A's value; only then does A release.
	for {
		if holder, ok := c.Observed(); ok && holder == "A" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := a.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	releaseWatch()
	select {
	case err := <-taken:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B did not take the lease released while its watch was being created (it waits for its TTL/3 poll)")
	}
	if e, _ := c.Held(); e != a.LastTerm().Epoch+1 {
		t.Fatalf("B holds epoch %d, want %d", e, a.LastTerm().Epoch+1)
	}
}

// TestReleaseHandsOverAtOnce: a released lease is taken by a waiting
// contender at once, with the next epoch. T is a minute and the contender
// waits at most 20 s, so waiting for T would fail the test.
func TestReleaseHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Minute
	a := newLease(t, b.bucket, "level.DELAYD_1M", "A", ttl, 0)
	c := newLease(t, b.bucket, "level.DELAYD_1M", "B", ttl, 0)
	acquire(t, a, 5*time.Second)
	taken := make(chan error, 1)
	go func() { taken <- c.Acquire(testCtx(t, 20*time.Second)) }()
	// Let B see A's revision first, so a takeover needs the release.
	time.Sleep(200 * time.Millisecond)
	if err := a.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ta := a.LastTerm(); !errors.Is(ta.Cause, ErrReleased) {
		t.Fatalf("A's term ended with %v, want ErrReleased", ta.Cause)
	}
	if err := <-taken; err != nil {
		t.Fatalf("B did not take the released lease: %v", err)
	}
	ta, tb := a.LastTerm(), c.LastTerm()
	if tb.Epoch != ta.Epoch+1 || !ta.ValidUntil.Before(tb.Acquired) {
		t.Fatalf("A %+v then B %+v: want B's epoch A's + 1, beginning after A's end", ta, tb)
	}
	e, err := b.kv.Get(testCtx(t, 5*time.Second), "level.DELAYD_1M")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := DecodeValue(e.Value()); err != nil || v.Holder != "B" || v.Epoch != tb.Epoch {
		t.Fatalf("stored value %s (%v), want B at epoch %d", e.Value(), err, tb.Epoch)
	}
}

// TestEpochsStrictlyIncrease: across every kind of change of holder (a
// release, an expiry, the key deleted or purged by hand, an unreadable
// value written by hand) the epoch strictly increases.
func TestEpochsStrictlyIncrease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Second
	const key = "level.DELAYD_10S"
	a := newLease(t, b.bucket, key, "A", ttl, 0)
	c := newLease(t, b.bucket, key, "B", ttl, 0)
	ctx := testCtx(t, 30*time.Second)
	var epochs []uint64
	record := func(l *Lease) {
		t.Helper()
		acquire(t, l, 10*time.Second)
		e, _ := l.Held()
		epochs = append(epochs, e)
	}
	record(a) // created
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	record(c) // after a release
	c.PauseRenewals(true)
	record(a) // after an expiry
	waitEnded(t, c, 5*time.Second)
	c.PauseRenewals(false)
	a.PauseRenewals(true)
	waitEnded(t, a, 5*time.Second)
	a.PauseRenewals(false)
	if err := b.kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	record(c) // after a delete by hand
	c.PauseRenewals(true)
	waitEnded(t, c, 5*time.Second)
	c.PauseRenewals(false)
	if err := b.kv.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	record(a) // after a purge by hand
	a.PauseRenewals(true)
	waitEnded(t, a, 5*time.Second)
	a.PauseRenewals(false)
	if _, err := b.kv.Put(ctx, key, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	record(c) // after an unreadable value
	for i := 1; i < len(epochs); i++ {
		if epochs[i] <= epochs[i-1] {
			t.Fatalf("epochs %v: not strictly increasing at change %d", epochs, i)
		}
	}
	t.Logf("epochs %v", epochs)
}

func TestValueEncoding(t *testing.T) {
	t.Parallel()
	b := Value{Holder: "h-1-ab", Epoch: 7}.encode()
	if string(b) != `{"v":1,"holder":"h-1-ab","epoch":7}` {
		t.Fatalf("encoded %s", b)
	}
	for _, bad := range []string{"", "7", `{"holder":"h","epoch":1}`, `{"v":2,"holder":"h","epoch":1}`} {
		if _, err := DecodeValue([]byte(bad)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeValue(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	b := &Bucket{}
	for _, cfg := range []Config{
		{Holder: "h"},
		{Key: "a b", Holder: "h"},
		{Key: ".x", Holder: "h"},
		{Key: "k"},
		{Key: "k", Holder: "h", TTL: -1},
		{Key: "k", Holder: "h", TTL: time.Second, Margin: 400 * time.Millisecond},
	} {
		if _, err := New(b, cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	if _, err := New(b, Config{Key: "level.DELAYD_1M30S-P0", Holder: "h"}); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

// TestLeasesLists: Leases lists every lease key with its holder, epoch and
// revision, a released one with an empty holder, and an unreadable value
// with ErrCorrupt; a key deleted by hand is left out.
func TestLeasesLists(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testCtx(t, 10*time.Second)
	if es, err := b.bucket.Leases(ctx); err != nil || len(es) != 0 {
		t.Fatalf("Leases of an empty bucket = %v, %v; want none", es, err)
	}
	r := newLease(t, b.bucket, "router", "A", time.Minute, 0)
	l := newLease(t, b.bucket, "level.DELAYD_5S", "B", time.Minute, 0)
	acquire(t, r, 5*time.Second)
	acquire(t, l, 5*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.kv.Put(ctx, "janitor", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.kv.Put(ctx, "gone", Value{Holder: "C", Epoch: 1}.encode()); err != nil {
		t.Fatal(err)
	}
	if err := b.kv.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	es, err := b.bucket.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 3 || es[0].Key != "janitor" || es[1].Key != "level.DELAYD_5S" || es[2].Key != "router" {
		t.Fatalf("Leases = %+v; want janitor, level.DELAYD_5S, router", es)
	}
	if !errors.Is(es[0].Err, ErrCorrupt) {
		t.Errorf("janitor: Err %v, want ErrCorrupt", es[0].Err)
	}
	if v := es[1].Value; v.Holder != "" || v.Epoch != 1 || es[1].Err != nil {
		t.Errorf("released level lease: %+v, want an empty holder at epoch 1", es[1])
	}
	if v := es[2].Value; v.Holder != "A" || v.Epoch != 1 || es[2].Revision == 0 || es[2].Err != nil {
		t.Errorf("router lease: %+v, want A at epoch 1", es[2])
	}
}

// TestDeletedByHandWaits: a held lease's key deleted by hand ends the
// holder's term at its next renewal (ErrLost), and a contender takes the
// key only T after it saw the delete marker, so the terms never overlap;
// the new epoch exceeds the old.
func TestDeletedByHandWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Second
	a := newLease(t, b.bucket, "level.DELAYD_30S", "A", ttl, 0)
	c := newLease(t, b.bucket, "level.DELAYD_30S", "B", ttl, 0)
	acquire(t, a, 5*time.Second)
	if err := b.kv.Delete(testCtx(t, 5*time.Second), "level.DELAYD_30S"); err != nil {
		t.Fatal(err)
	}
	acquire(t, c, 10*time.Second)
	ta, tc := a.LastTerm(), c.LastTerm()
	if !ta.Ended || !errors.Is(ta.Cause, ErrLost) {
		t.Fatalf("A's term after the delete: %+v; want ended with ErrLost", ta)
	}
	if !ta.ValidUntil.Before(tc.Acquired) || tc.Epoch <= ta.Epoch {
		t.Fatalf("A %+v and B %+v overlap or do not increase the epoch", ta, tc)
	}
}

// replyProxy is a TCP proxy to a server whose bytes to the client it can
// hold (the client's to the server always pass): a reply the server sent
// and the client has not read yet.
type replyProxy struct {
	ln   net.Listener
	mu   sync.Mutex
	gate chan struct{} // closed while passing
}

func startReplyProxy(t *testing.T, target string) *replyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyProxy{ln: ln, gate: make(chan struct{})}
	close(p.gate)
	t.Cleanup(func() { _ = ln.Close(); p.pass() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = up.Close() })
			go func() { _, _ = io.Copy(up, c) }()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 {
						p.mu.Lock()
						gate := p.gate
						p.mu.Unlock()
						<-gate
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// hold holds the server's bytes from now on, until pass.
func (p *replyProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

func (p *replyProxy) pass() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// holdClaimer holds the server's replies at the claim before an acquiring
// write: the write is stored, its reply not read.
type holdClaimer struct{ p *replyProxy }

func (g holdClaimer) Claim(string, time.Duration) (func(), bool) {
	g.p.hold()
	return func() {}, true
}

// TestCancelledAcquireReleased: a replica stopped while it takes a lease
// (its context cancelled while the acquiring write is in flight) must not
// leave the write stored with no term of its: every other replica would
// wait one TTL for the lease. Here the server stores A's write and holds
// its reply until A's context is cancelled; then B must take the lease at
// once.
func TestCancelledAcquireReleased(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	bucketAt := func(url string) *Bucket {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		b, err := OpenBucket(testCtx(t, 10*time.Second), js, BucketConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	direct := bucketAt(srv.ClientURL())
	p := startReplyProxy(t, srv.Addr().String())
	const key, ttl = "level.DELAYD_1M", time.Minute
	a, err := New(bucketAt("nats://"+p.ln.Addr().String()), Config{Key: key, Holder: "A", TTL: ttl, Claimer: holdClaimer{p}})
	if err != nil {
		t.Fatal(err)
	}
	c := newLease(t, direct, key, "B", ttl, 0)
	ctx, cancel := context.WithCancel(testCtx(t, 30*time.Second))
	done := make(chan error, 1)
	go func() {
		_, err := a.TryAcquire(ctx)
		done <- err
	}()
	for stored := false; !stored; {
		if e, err := direct.kv.Get(testCtx(t, 5*time.Second), key); err == nil {
			v, _ := DecodeValue(e.Value())
			stored = v.Holder == "A"
		}
		if ctx.Err() != nil {
			t.Fatal("A's write not stored")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	var aerr error
	returned := false
	select {
	case aerr = <-done: // returned at the cancel, its reply unread
		returned = true
	case <-time.After(time.Second): // waits for its write's reply
	}
	p.pass()
	if !returned {
		aerr = <-done
	}
	if !errors.Is(aerr, context.Canceled) {
		t.Fatalf("A's TryAcquire: %v, want context.Canceled", aerr)
	}
	if _, valid := a.Held(); valid {
		t.Fatal("A holds a term after its cancelled TryAcquire")
	}
	held, err := c.TryAcquire(testCtx(t, 5*time.Second))
	if err != nil || !held {
		t.Fatalf("B's TryAcquire: %v, %v; want held at once (A's stored write left for its TTL)", held, err)
	}
	if tb := c.LastTerm(); tb.Epoch != 2 {
		t.Fatalf("B holds epoch %d, want 2", tb.Epoch)
	}
}

// countHandler counts the records whose message is msg, by level.
type countHandler struct {
	msg  string
	mu   sync.Mutex
	byLv map[slog.Level]int
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.mu.Lock()
		h.byLv[r.Level]++
		h.mu.Unlock()
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

func (h *countHandler) counts() (all, warn int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for lv, n := range h.byLv {
		all += n
		if lv >= slog.LevelWarn {
			warn += n
		}
	}
	return all, warn
}

// TestAcquireFailuresBackOff: a waiting Acquire whose tries fail at once
// (its connection closed here; a reconnecting connection whose buffer is
// full fails every request at once the same way) tries again at most
// every acquireRetryMin, and logs the first failure at warn, not each one.
// Past the holder's expiry as last seen, nothing else spaces the tries: on
// the code before, B tried (and logged a warning) about once a
// millisecond, as r0 did in CI while cut off (TestReplicasCutOff).
func TestAcquireFailuresBackOff(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	bucket, err := OpenBucket(testCtx(t, 10*time.Second), js, BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 600 * time.Millisecond
	a := newLease(t, bucket, "level.DELAYD_5S", "A", ttl, 0)
	acquire(t, a, 5*time.Second)

	// B on a connection of its own, which the test closes.
	nc2, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	bucket2, err := BindBucket(testCtx(t, 10*time.Second), js2, BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &countHandler{msg: "lease acquire failed; retrying", byLv: map[slog.Level]int{}}
	bl, err := New(bucket2, Config{Key: "level.DELAYD_5S", Holder: "B", TTL: ttl, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bl.Acquire(ctx) }()
	time.Sleep(ttl / 2) // B has read the key: A holds it
	if holder, ok := bl.Observed(); !ok || holder != "A" {
		t.Fatalf("B observed %q (%v), want A", holder, ok)
	}
	nc2.Close()
	const watch = 2 * time.Second // past the expiry B last saw: ttl after its last read
	time.Sleep(watch)
	all, warn := logs.counts()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("B's Acquire: %v, want context.Canceled", err)
	}
	t.Logf("%d failed tries in %s after the close (%d at warn)", all, watch, warn)
	if most := int(watch/acquireRetryMin) + 10; all > most {
		t.Errorf("%d failed tries in %s, want at most %d: tries %s apart at least", all, watch, most, acquireRetryMin)
	}
	if all == 0 {
		t.Error("no failed try logged: the close did not fail B's tries")
	}
	if warn > 1 {
		t.Errorf("%d failed tries logged at warn, want only the first", warn)
	}
}
