package deliver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/leadership"
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
	b := setupOwners(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := New(b.nc, Config{Levels: table})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := svc.setup(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r, err := newRouter(mustJS(nc, 0), RouterConfig{Prefix: "delay", Levels: table},
		routerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: svc.hopKey})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	r.ackTimeout = 300 * time.Millisecond
	r.loseAcks = func(n uint64) bool {
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
		_ = r.runTerm(rctx, leadership.Term{Epoch: 1})
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
		in, err := b.js.Stream(ctx, IngressStream)
		if err != nil {
			t.Fatal(err)
		}
		if in.CachedInfo().State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %d messages a minute after every write was settled", IngressStream, in.CachedInfo().State.Msgs)
		}
	}
}

// TestScannerLostPubAckRetried: the PubAcks of the scanner's 3rd, 7th and
// 12th deliveries to a stream-bound target are dropped on their way back
// (the deliveries are stored). Each times out after the scanner's PubAck
// timeout and is sent again; the retry carries the same Nats-Msg-Id, so the
// target stream drops it as a duplicate. The target stream must hold each
// of the 20 messages exactly once, in level order, and the offset must
// pass all of them.
func TestScannerLostPubAckRetried(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := New(b.nc, Config{Levels: table})
	if err != nil {
		t.Fatal(err)
	}
	_, store, _, err := svc.setup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TGT", Subjects: []string{"tgt.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	subject := levelSubjects + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	due := contract.FormatTime(time.Now().Add(-time.Minute))
	var want []string
	for i := range n {
		p := fmt.Sprintf("m-%d", i)
		h := nats.Header{contract.HeaderDueAt: {due}, hdrIngress: {fmt.Sprintf("delayd-1-%d", i+1)}}
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(p)}); err != nil {
			t.Fatal(err)
		}
		want = append(want, p)
	}

	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js := mustJS(nc, 0)
	targets := NewTargetIndex(nc, js, nil)
	if err := targets.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := newScanner(nc, js, ScannerConfig{Stream: stream, Offsets: store, Targets: targets},
		scannerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: svc.hopKey})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	s.ackTimeout = 300 * time.Millisecond
	s.loseAcks = func(n uint64) bool {
		if n == 3 || n == 7 || n == 12 {
			lost.Add(1)
			return true
		}
		return false
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.runTerm(sctx, leadership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	for deadline := time.Now().Add(time.Minute); s.Stats().Offset < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the scanner's offset is %d of %d (lost PubAcks: %d, stats %+v)", s.Stats().Offset, n, lost.Load(), s.Stats())
		}
	}
	if got := lost.Load(); got != 3 {
		t.Fatalf("%d PubAcks dropped, want 3: this run does not test lost PubAcks", got)
	}
	// The first lost PubAck fails the window and is retried; the two
	// behind it in flight are sent again with it (unsure), not counted.
	if st := s.Stats(); st.Retries == 0 || st.Delivered != n {
		t.Errorf("stats %+v: want a retry (the lost PubAcks time out) and %d delivered", st, n)
	}
	tgt, err := b.js.Stream(ctx, "TGT")
	if err != nil {
		t.Fatal(err)
	}
	info := tgt.CachedInfo()
	var got []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := tgt.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("TGT sequence %d: %v", seq, err)
		}
		got = append(got, string(m.Data))
	}
	if !slices.Equal(got, want) {
		t.Errorf("TGT holds %d messages %q;\nwant each of the %d once, in order %q", len(got), got, n, want)
	}
}
