package level

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

// TestFeed reads a real level-like stream through the scanner's feed: from
// the position reset gives, in sequence order, with each message's store
// time; again from an earlier position after another reset; and it ends
// with jswire.ErrConsumerDeleted when the consumer goes.
func TestFeed(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const stream = "DELAYD_FEEDTEST"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"feedtest.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(ctx, "feedtest.x", fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	f := newFeed(nc, js, stream, 4, 0)
	defer f.close()
	readFrom := func(from uint64) {
		t.Helper()
		if err := f.reset(ctx, from); err != nil {
			t.Fatal(err)
		}
		for want := max(from, 1); want <= n; want++ {
			m, meta, err := f.next(ctx, nil, true, 0)
			if err != nil || m == nil {
				t.Fatalf("from %d: message %d: %v, %v", from, want, m, err)
			}
			if meta.StreamSeq != want || meta.Stored.IsZero() || string(m.Data) != fmt.Sprintf("m%d", want) {
				t.Fatalf("from %d: got %q %+v, want sequence %d", from, m.Data, meta, want)
			}
		}
	}
	readFrom(4)
	// Caught up: nothing at once without blocking, nothing within a timeout.
	if m, _, err := f.next(ctx, nil, false, 0); m != nil || err != nil {
		t.Fatalf("caught up, not blocking: %v, %v", m, err)
	}
	if m, _, err := f.next(ctx, nil, true, 50*time.Millisecond); m != nil || err != nil {
		t.Fatalf("caught up, timeout: %v, %v", m, err)
	}
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	if _, _, err := f.next(ctx, wake, true, 0); !errors.Is(err, jswire.ErrWoken) {
		t.Fatalf("woken: %v", err)
	}
	// The position is the caller's: back to the start.
	readFrom(0)
	if err := js.DeleteConsumer(ctx, stream, f.name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.next(ctx, nil, true, 0); !errors.Is(err, jswire.ErrConsumerDeleted) {
		t.Fatalf("consumer deleted: %v", err)
	}
}

// feedStream creates a level-like stream holding m1..mn for feed tests.
func feedStream(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, subject string, n int) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFeedResetAnswersLost: a reset whose delete and create are both
// applied but whose answers are lost (held by a server that hangs) sends
// each again: the delete sent again is answered "not found", which is
// done, and the create sent again, the same create, is answered. The feed
// then reads from the reset's position. Seen to fail with the requests
// sent once: the reset waited out jswire.OpTimeout and failed.
func TestFeedResetAnswersLost(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const stream = "DELAYD_FEEDLOST"
	feedStream(t, ctx, js, stream, "feedlost.x", 6)
	f := newFeed(nc, js, stream, 4, 0)
	defer f.close()
	if err := f.reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The next reset's requests: 1 delete (lost), 2 delete again, 3 create
	// (lost), 4 create again.
	base := f.requests.Load()
	var lost atomic.Int64
	f.lose = func(n uint64) bool {
		if n == base+1 || n == base+3 {
			lost.Add(1)
			return true
		}
		return false
	}
	if err := f.reset(ctx, 4); err != nil {
		t.Fatalf("reset with its delete's and create's first answers lost: %v", err)
	}
	if lost.Load() != 2 || f.requests.Load() != base+4 {
		t.Fatalf("%d answers lost of %d requests; want 2 of 4", lost.Load(), f.requests.Load()-base)
	}
	for want := uint64(4); want <= 6; want++ {
		m, meta, err := f.next(ctx, nil, true, 0)
		if err != nil || m == nil || meta.StreamSeq != want {
			t.Fatalf("after the reset: %v (sequence %d), %v; want sequence %d", m, meta.StreamSeq, err, want)
		}
	}
}

// TestFeedPlacedOffSuspect: a reset after the consumer went silent
// (jswire.ErrNoHeartbeat: next names its server the suspect) does not
// take a consumer created on that server while it may create again: on
// one server every create lands there, so the reset creates
// feedPlaceTries times, takes the last, and forgets the suspect. Seen to
// fail without the check: one create.
func TestFeedPlacedOffSuspect(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const stream = "DELAYD_FEEDSUSPECT"
	feedStream(t, ctx, js, stream, "feedsuspect.x", 3)
	f := newFeed(nc, js, stream, 4, 0)
	defer f.close()
	if err := f.reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if f.leader == "" {
		t.Fatal("the created consumer's server is not known")
	}
	base := f.requests.Load()
	f.suspect = f.leader // as next does on jswire.ErrNoHeartbeat
	if err := f.reset(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if n := f.requests.Load() - base; n != 2*feedPlaceTries || f.suspect != "" {
		t.Fatalf("reset off the suspected server: %d requests, suspect %q; want %d (a delete and a create per try), none",
			n, f.suspect, 2*feedPlaceTries)
	}
	if m, meta, err := f.next(ctx, nil, true, 0); err != nil || m == nil || meta.StreamSeq != 2 {
		t.Fatalf("after the reset: %v (sequence %d), %v; want sequence 2", m, meta.StreamSeq, err)
	}
}
