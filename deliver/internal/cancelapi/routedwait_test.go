package cancelapi

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/natstest"
)

// TestRoutedWaitAnswer: a worker's wait gets its bound and the server's
// time of the stream info that bounded it in the routed wait's answer,
// sent by the wait's own goroutine on the waiter's channel: the bound is
// the ingress stream's last sequence when the worker asked, and the time
// is the info's TimeStamp (not the waitNow fallback to this process's
// clock), taken no earlier than the ask.
func TestRoutedWaitAnswer(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: resource.IngressStream, Subjects: []string{"routedwait.>"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := js.Publish(ctx, "routedwait.t", nil); err != nil {
			t.Fatal(err)
		}
	}
	// Both messages stay in the stream: as invalid ones waiting for
	// DELAYD_DLQ, they do not hold the wait.
	g := newRoutedWait(js, func() int { return 2 })
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { g.run(rctx) })
	defer wg.Wait()
	defer stop()

	info, err := js.Stream(ctx, resource.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	before := info.CachedInfo().TimeStamp
	a, caughtUp, err := g.ask().await(ctx)
	if err != nil || !caughtUp {
		t.Fatalf("await: caught up %v, error %v; want caught up", caughtUp, err)
	}
	if a.upTo != 2 {
		t.Errorf("bound %d, want 2 (the last sequence when asked)", a.upTo)
	}
	if a.at.IsZero() || a.at.Before(before) {
		t.Errorf("answer's time %v, want the server's time of an info after %v", a.at, before)
	}
	upTo, caughtUp, err := g.ask().waitBound(ctx)
	if err != nil || !caughtUp || upTo != 2 {
		t.Errorf("waitBound: %d, %v, %v; want 2, caught up", upTo, caughtUp, err)
	}
}
