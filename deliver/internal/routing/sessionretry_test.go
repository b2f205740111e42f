package routing

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/levels"
)

// TestRouterFailedWriteAcrossSessions: a level write fails, its retry's
// resync cannot read the level stream's tail (a test hook), so the session
// ends; the next session cannot read that tail either for its first 2 s,
// and creates its ingress consumer with the level not synced (held). The
// failed write must not be sent again with the expectation the earlier
// session left (its last sequence, plus one for every copy sent): that
// expectation is no longer right, and the level's own sync, which would
// correct it, is applied only between retry rounds that never end. (The
// live-lock of a hung node's resume: `level writes failed; retrying in
// order … wrong last sequence` for ever, /work/notes/hang.) Once the tail
// reads again, the level must hold m0 and m1 once each, in order, and the
// ingress stream end empty.
//
//   - not stored: the level stream refuses m1 (its message limit, discard
//     new) until the next session has created its consumer; sent again with
//     the stale expectation, m1 is refused for ever.
//   - PubAck lost: m1 is stored and its PubAck dropped; sent again with the
//     stale expectation (the stream's last sequence now), it is stored
//     twice.
func TestRouterFailedWriteAcrossSessions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		notStored bool
	}{{"not stored", true}, {"PubAck lost", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testFailedWriteAcrossSessions(t, tc.notStored)
		})
	}
}

func testFailedWriteAcrossSessions(t *testing.T, notStored bool) {
	b := setupServer(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, b.nc, table)
	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r, err := New(mustJS(nc, 0), Config{Prefix: "delay", Levels: table},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret})
	if err != nil {
		t.Fatal(err)
	}
	var unreadable atomic.Bool // the level stream's tail reads fail
	r.SetTailHook(func(s string) error {
		if s == stream && unreadable.Load() {
			return errors.New("tail unreadable (test hook)")
		}
		return nil
	})
	var lose, lost atomic.Bool // drop the next PubAck, once
	r.hooks.ackTimeout = 300 * time.Millisecond
	r.hooks.loseAcks = func(uint64) bool { return lose.Load() && !lost.Swap(true) }

	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.RunTerm(rctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	b.publishTo("tgt.x", "m0", nats.Header{contract.HeaderLevel: {"1"}})
	for deadline := time.Now().Add(time.Minute); r.Stats().Routed < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("m0 not routed after a minute")
		}
	}
	first := consumerCreated(t, ctx, b.js, time.Time{})

	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if notStored {
		full := cfg
		full.MaxMsgs, full.Discard = int64(s.CachedInfo().State.Msgs), jetstream.DiscardNew
		if _, err := b.js.UpdateStream(ctx, full); err != nil {
			t.Fatal(err)
		}
	} else {
		lose.Store(true)
	}
	unreadable.Store(true)
	b.publishTo("tgt.x", "m1", nats.Header{contract.HeaderLevel: {"1"}})

	// The next session's consumer: it was created with the level not synced
	// (its reads failed for syncStartWait), and its session routes from here.
	consumerCreated(t, ctx, b.js, first)
	if notStored {
		if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	} else if !lost.Load() {
		t.Fatal("no PubAck dropped: this run does not test a lost PubAck")
	}
	unreadable.Store(false)

	want := []string{"m0", "m1"}
	var got []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		got = levelPayloads(t, ctx, b.js, stream)
		in, err := b.js.Stream(ctx, resource.IngressStream)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= len(want) && in.CachedInfo().State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the tail reads again, %s holds %q and ingress %d messages (stats %+v): the failed write is never stored",
				stream, got, in.CachedInfo().State.Msgs, r.Stats())
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s holds %q; want each of %q once, in order", stream, got, want)
	}
}

// consumerCreated waits until this term's (epoch 1) ingress consumer exists,
// created after not (another session's than one created at not), and
// returns its creation time.
func consumerCreated(t *testing.T, ctx context.Context, js jetstream.JetStream, not time.Time) time.Time {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		c, err := js.Consumer(ctx, resource.IngressStream, RouterConsumerName(1))
		if err == nil && c.CachedInfo().Created.After(not) {
			return c.CachedInfo().Created
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ingress consumer %s created after %v: %v", RouterConsumerName(1), not, err)
		}
	}
}

// levelPayloads returns the payloads of stream's level messages (not its
// markers), in order.
func levelPayloads(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) []string {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	st := s.CachedInfo().State
	var got []string
	for seq := max(st.FirstSeq, 1); seq <= st.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("%s sequence %d: %v", stream, seq, err)
		}
		if !isMarkerMsg(&nats.Msg{Header: m.Header}) {
			got = append(got, string(m.Data))
		}
	}
	return got
}
