package routing

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/levels"
)

// TestRouterIndexAnswerLost: the PubAck of the first copy of the router's
// first id index write is lost (a test hook sends that copy without a reply
// subject: DELAYD_INDEX stores it, nobody answers), as when the index
// stream's leader hangs. The write must be sent again after a short
// attempt (jswire.WriteAttempt), not wait out the publish-async timeout (10
// s), at whose end it used to fail ("id index write failed; the messages
// cannot be cancelled"), holding every write confirmed behind it and the
// level writes' retry round meanwhile. Every message is routed with no
// index error, no failed level write and no session restart, and each
// one's record is found in the index.
func TestRouterIndexAnswerLost(t *testing.T) {
	t.Parallel()
	b := setupServer(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, b.nc, table)
	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var logs lockedBuffer
	r, err := New(mustJS(nc, 0), Config{Prefix: "delay", Levels: table, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret})
	if err != nil {
		t.Fatal(err)
	}
	var copies atomic.Int64
	r.hooks.loseIndex = func() bool { return copies.Add(1) == 1 }

	const n = 20
	for i := range n {
		b.publishTo("tgt.x", fmt.Sprintf("m-%d", i), nats.Header{contract.HeaderLevel: {"1"}})
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.RunTerm(rctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if st := r.Stats(); st.Routed >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the router routed %d of %d; its log:\n%s", r.Stats().Routed, n, logs.String())
		}
	}
	if got := copies.Load(); got < 2 {
		t.Fatalf("%d copies of index writes sent, want the first lost and more: this run does not test a lost index answer", got)
	}
	if st := r.Stats(); st.IndexErrors != 0 {
		t.Errorf("stats %+v: %d index writes failed, want none (the unanswered copy sent again); its log:\n%s", st, st.IndexErrors, logs.String())
	}
	for _, bad := range []string{"id index write failed", "level writes failed", "router restarting"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the router logged %q, want nothing failed; its log:\n%s", bad, logs.String())
		}
	}
	reader, err := jswire.NewBatchReader(b.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= n; seq++ {
		rec, ok, err := index.Lookup(ctx, reader, index.SeqKey(seq), 5*time.Second)
		if err != nil || !ok || rec.Stream != level.Stream() {
			t.Errorf("index record of ingress message %d: %+v found %v, error %v; want it at %s", seq, rec, ok, err, level.Stream())
		}
	}
}
