package ownership

import (
	"context"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/lease"
)

// TestBalancerSparesRecovering: a replica holding both of its two leases
// when a second replica joins hands one over; the router's (the last key,
// handed over first) is spared while its work is recovering
// ([Term.Recovering]), so the level's goes instead.
func TestBalancerSparesRecovering(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	member := func(holder string) *lease.Membership {
		m, err := lease.NewMembership(b.bucket, lease.MembershipConfig{Holder: holder, TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}
	bal, err := NewBalancer(BalancerConfig{Members: member("a"), TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan string, 4)
	run := func(key string, recovering bool) chan struct{} {
		e, err := New(Config{Bucket: b.bucket, Key: key, Holder: "a", TTL: testTTL, Balancer: bal})
		if err != nil {
			t.Fatal(err)
		}
		gained := make(chan struct{})
		go func() {
			_ = e.Run(ctx, func(ctx context.Context, term Term) error {
				term.Recovering(recovering)
				close(gained)
				<-ctx.Done()
				if context.Cause(ctx) == ErrHandedOver {
					ended <- key
				}
				<-ctx.Done()
				return nil
			})
		}()
		return gained
	}
	level, router := LevelKey("DELAYD_1S"), RouterKey
	for _, g := range []chan struct{}{run(level, false), run(router, true)} {
		select {
		case <-g:
		case <-time.After(10 * time.Second):
			t.Fatal("a lease not gained within 10 s")
		}
	}
	member("b").Bidding() // joins: a's share is now 1 of 2
	for range 50 {
		bal.tick()
		select {
		case key := <-ended:
			if key != level {
				t.Fatalf("handed %s over, want %s (the router's work is recovering)", key, level)
			}
			return
		case <-time.After(testTTL / 10):
		}
	}
	t.Fatal("nothing handed over within 5 TTLs of a replica joining")
}
