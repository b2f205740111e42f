package lease

import (
	"context"
	"errors"
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
// counted out and its key is gone; membership keys are not leases.
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
