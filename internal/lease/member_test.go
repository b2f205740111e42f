package lease

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// startMember starts holder's membership with settings; it leaves when
// the returned cancel is called or the test ends.
func startMember(t *testing.T, b *Bucket, holder string, settings map[string]string) (*Membership, context.CancelFunc, error) {
	t.Helper()
	m, err := NewMembership(b, MembershipConfig{Holder: holder, TTL: time.Second, Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	err = m.Start(ctx)
	m.Bidding()
	return m, cancel, err
}

func waitLive(t *testing.T, m *Membership, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for m.Live() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s counts %d live members (%v), want %d", m.holder, m.Live(), m.Members(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMembershipLive: two members count each other; one that leaves is
// counted out and its key is gone; one whose key stays but is not renewed
// (a crashed replica's) is counted out once it was unchanged for the TTL;
// membership keys are not leases.
func TestMembershipLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, _, err := startMember(t, b.bucket, "A", nil)
	if err != nil {
		t.Fatal(err)
	}
	c, leaveC, err := startMember(t, b.bucket, "B", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitLive(t, a, 2)
	waitLive(t, c, 2)
	// Renewals keep both live, sampled for two TTLs.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if a.Live() != 2 || c.Live() != 2 {
			t.Fatalf("live: A counts %d, B %d; want 2", a.Live(), c.Live())
		}
	}
	if ls, err := b.bucket.Leases(testCtx(t, 5*time.Second)); err != nil || len(ls) != 0 {
		t.Errorf("Leases lists %v (%v); membership keys are not leases", ls, err)
	}
	leaveC()
	<-c.Done()
	if _, err := b.kv.Get(testCtx(t, 5*time.Second), MemberKey("B")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("B left, but its key: %v", err)
	}
	waitLive(t, a, 1)

	// A crashed replica's key: written once, never renewed, never deleted.
	crashed, err := json.Marshal(Member{Version: ValueVersion, Holder: "Z", Bidding: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.kv.Put(testCtx(t, 5*time.Second), MemberKey("Z"), crashed); err != nil {
		t.Fatal(err)
	}
	waitLive(t, a, 2)
	waitLive(t, a, 1)
	if _, err := b.kv.Get(testCtx(t, 5*time.Second), MemberKey("Z")); err != nil {
		t.Errorf("Z's key: %v; want it still there (counted out by its age, not by its deletion)", err)
	}
}

// TestMembershipMismatch: a member whose setting differs from a live
// member's fails to start with a *MismatchError naming the setting, and
// leaves no key; once the live one has left, it starts.
func TestMembershipMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, leaveA, err := startMember(t, b.bucket, "A", map[string]string{"DELAYD_LEVELS": "1s 5s", "DELAYD_PREFIX": "delay"})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = startMember(t, b.bucket, "B", map[string]string{"DELAYD_LEVELS": "1s 10s", "DELAYD_PREFIX": "delay"})
	var me *MismatchError
	if !errors.As(err, &me) || !errors.Is(err, ErrMismatch) || me.Setting != "DELAYD_LEVELS" || me.Theirs != "1s 5s" || me.Holder != "A" {
		t.Fatalf("B's Start: %v; want a MismatchError for DELAYD_LEVELS against A's", err)
	}
	t.Log(err)
	if _, err := b.kv.Get(testCtx(t, 5*time.Second), MemberKey("B")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("B refused to start, but its key: %v", err)
	}
	// Same settings, or a setting A does not have: no conflict.
	c, leaveC, err := startMember(t, b.bucket, "C", map[string]string{"DELAYD_LEVELS": "1s 5s", "OTHER": "x"})
	if err != nil {
		t.Fatalf("C, same table: %v", err)
	}
	leaveA()
	leaveC()
	<-a.Done()
	<-c.Done()
	if _, _, err := startMember(t, b.bucket, "D", map[string]string{"DELAYD_LEVELS": "1s 10s"}); err != nil {
		t.Fatalf("D, the new table once every member with the old one left: %v", err)
	}
}

// idleClaimer declines every bid until the lease has been free for min, and
// records the idle times it was asked with.
type idleClaimer struct {
	min time.Duration
	mu  sync.Mutex
	ask []time.Duration
}

func (g *idleClaimer) Claim(_ string, idle time.Duration) (func(), bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ask = append(g.ask, idle)
	return func() {}, idle >= g.min
}

// TestClaimerIdle: a Claimer is asked before every taking write with how long
// the lease has been free: for a released key, since the first read that
// showed the release; for a key a holder stopped renewing, since it was
// free to take (first seen + TTL). A declined bid takes nothing; the bid
// goes ahead once the Claimer allows it (the balancer's grace), and never
// before the stopped holder's term ended.
func TestClaimerIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = 500 * time.Millisecond
	a := newLease(t, b.bucket, "level.DELAYD_1S", "A", ttl, 0)
	acquire(t, a, 5*time.Second)
	if err := a.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	g := &idleClaimer{min: 300 * time.Millisecond}
	l, err := New(b.bucket, Config{Key: "level.DELAYD_1S", Holder: "B", TTL: ttl, Claimer: g})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if held, err := l.TryAcquire(testCtx(t, 5*time.Second)); held || err != nil {
		t.Fatalf("first bid on the released lease: held %v (%v), want declined", held, err)
	}
	acquire(t, l, 10*time.Second)
	waited := time.Since(start)
	g.mu.Lock()
	asks := slices.Clone(g.ask)
	g.mu.Unlock()
	if !slices.IsSorted(asks) || asks[len(asks)-1] < g.min || waited < g.min {
		t.Fatalf("idle times asked %v, taken after %s: want increasing up to %s", asks, waited, g.min)
	}
	// B holds it now and stops renewing: C's claimer is asked once B's
	// revision was unchanged for the TTL, with the time since then.
	l.PauseRenewals(true)
	g2 := &idleClaimer{min: 200 * time.Millisecond}
	c, err := New(b.bucket, Config{Key: "level.DELAYD_1S", Holder: "C", TTL: ttl, Claimer: g2})
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, c, 10*time.Second)
	g2.mu.Lock()
	defer g2.mu.Unlock()
	if len(g2.ask) == 0 || !slices.IsSorted(g2.ask) || g2.ask[len(g2.ask)-1] < g2.min {
		t.Fatalf("idle times asked of C's claimer: %v; want increasing up to %s", g2.ask, g2.min)
	}
	if tb, tc := l.LastTerm(), c.LastTerm(); !tb.ValidUntil.Before(tc.Acquired) {
		t.Fatalf("C's term began before B's ended: %+v, %+v", tb, tc)
	}
}
