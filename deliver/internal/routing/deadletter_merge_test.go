package routing

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/levels"
)

// TestTooLargeLevelWriteSettlesMerge: a message with a merge key whose
// level write the level stream refuses for its size is dead-lettered by
// the router (deadLetterSync). Its merge key must leave the router's
// in-flight placements: the merge cache then holds its latest placement,
// "left delayd" (no stream), so a later message with the key is never
// merged into it, and nothing stays in flight for ever.
func TestTooLargeLevelWriteSettlesMerge(t *testing.T) {
	t.Parallel()
	b := setupServer(t)
	table := levels.MustParse("1m")
	level, _ := table.Level(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, b.nc, table)
	s, err := b.js.Stream(ctx, level.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 1024
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	gate := newHeldOwners()
	close(gate.release) // merge checks pass at once
	r, err := New(mustJS(nc, 0), Config{Prefix: "delay", Levels: table},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret, Owners: gate})
	if err != nil {
		t.Fatal(err)
	}
	b.publishTo("tgt.x", strings.Repeat("a", 2048), nats.Header{contract.HeaderLevel: {"1"}, contract.HeaderMergeKey: {"k1"}})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.RunTerm(rctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(time.Minute); r.Stats().DeadLettered == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the router did not dead-letter the message too large for %s within a minute: %+v", level.Stream(), r.Stats())
		}
	}
	r.merges.mu.Lock()
	flight := len(r.merges.p.flight)
	r.merges.mu.Unlock()
	rec, ok := r.merges.lookup(index.MergeKey("tgt.x", "k1"))
	if flight != 0 || !ok || rec.Stream != "" {
		t.Errorf("after the dead letter: %d merge keys in flight, cached placement %+v (known %v); want none in flight, cached as left delayd", flight, rec, ok)
	}
}
