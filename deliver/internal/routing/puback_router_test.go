package routing

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/levels"
)

// TestRouterLostPubAckRetried: the PubAcks of the router's 3rd, 7th and
// 12th level writes are dropped on their way back (the writes are
// stored). Each write times out after the router's PubAck timeout and is
// retried: the retry's tail sync finds it stored and acks its ingress
// message without writing it again. The level stream must hold each of
// the 40 messages exactly once, in ingress order, and ingress must end
// empty.
func TestRouterLostPubAckRetried(t *testing.T) {
	t.Parallel()
	b := setupServer(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	var lost atomic.Int64
	r.hooks.ackTimeout = 300 * time.Millisecond
	r.hooks.loseAcks = func(n uint64) bool {
		if n == 3 || n == 7 || n == 12 {
			lost.Add(1)
			return true
		}
		return false
	}

	const n = 40
	var want []string
	for i := range n {
		p := fmt.Sprintf("m-%d", i)
		b.publishTo("tgt.x", p, nats.Header{contract.HeaderLevel: {"1"}})
		want = append(want, p)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.RunTerm(rctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		st := r.Stats()
		if st.Routed+st.Skipped >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the router routed %d and skipped %d of %d (lost PubAcks: %d)", st.Routed, st.Skipped, n, lost.Load())
		}
	}
	if got := lost.Load(); got != 3 {
		t.Fatalf("%d PubAcks dropped, want 3: this run does not test lost PubAcks", got)
	}
	if st := r.Stats(); st.Skipped == 0 {
		t.Errorf("stats %+v: no write found stored by a retry (Skipped 0), though 3 PubAcks were lost", st)
	}

	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("%s sequence %d: %v", stream, seq, err)
		}
		if isMarkerMsg(&nats.Msg{Header: m.Header}) {
			continue
		}
		got = append(got, string(m.Data))
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s holds %d level messages %q;\nwant each of the %d once, in order %q", stream, len(got), got, n, want)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		in, err := b.js.Stream(ctx, resource.IngressStream)
		if err != nil {
			t.Fatal(err)
		}
		if in.CachedInfo().State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %d messages a minute after every write was settled", resource.IngressStream, in.CachedInfo().State.Msgs)
		}
	}
}
