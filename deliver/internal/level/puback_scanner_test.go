package level

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// TestScannerLostPubAckRetried: the PubAcks of the scanner's 3rd, 7th and
// 12th deliveries to a stream-bound target are dropped on their way back
// (the deliveries are stored). Each times out after the scanner's PubAck
// timeout and is sent again; the retry carries the same Nats-Msg-Id, so the
// target stream drops it as a duplicate. The target stream must hold each
// of the 20 messages exactly once, in level order, and the offset must
// pass all of them.
func TestScannerLostPubAckRetried(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TGT", Subjects: []string{"tgt.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	due := contract.FormatTime(time.Now().Add(-time.Minute))
	var want []string
	for i := range n {
		p := fmt.Sprintf("m-%d", i)
		h := nats.Header{contract.HeaderDueAt: {due}, message.HdrIngress: {fmt.Sprintf("delayd-1-%d", i+1)}}
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
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	targets := target.New(nc, js, nil)
	if err := targets.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := New(nc, js, Config{Stream: stream, Offsets: store, Targets: targets},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	s.hooks.ackTimeout = 300 * time.Millisecond
	s.hooks.loseAcks = func(n uint64) bool {
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
		_ = s.RunTerm(sctx, ownership.Term{Epoch: 1})
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

// scannerBundle is a server and a connection to it.
type scannerBundle struct {
	t   *testing.T
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func setupScanner(t *testing.T) *scannerBundle {
	t.Helper()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &scannerBundle{t: t, srv: srv, nc: nc, js: js}
}

// setup creates what a Service's setup creates for the level stream's
// scanner (the level stream, the id index and cancel streams, the offsets
// bucket) and returns the offsets store and a hop key.
func (b *scannerBundle) setup(ctx context.Context, stream string) (*offsets.Store, hop.Key) {
	b.t.Helper()
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        stream,
		Subjects:    []string{contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".>"},
		AllowDirect: true,
		Duplicates:  100 * time.Millisecond,
	}); err != nil {
		b.t.Fatal(err)
	}
	if err := index.EnsureStreams(ctx, b.js, 1); err != nil {
		b.t.Fatal(err)
	}
	store, err := offsets.New(ctx, b.js, offsets.Config{})
	if err != nil {
		b.t.Fatal(err)
	}
	key := make(hop.Key, hop.KeySize)
	_, _ = rand.Read(key)
	return store, key
}
