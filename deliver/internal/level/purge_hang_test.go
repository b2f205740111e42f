package level

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// TestPurgeLeaderRequestsSentAgain: the first try of the scanner's
// stream info (owner.sameStream, asked before a purge; the first try is
// in fact the one each load asks before its feed starts, the same call)
// and the first try of the purge itself are never sent (a test hook holds them until their context ends), as when
// the level stream's leader hangs; the scanner waits for both on its
// goroutine, holding the level's head. Each must be sent again after
// hedge.AfterLeader and answered, while the lost try still waits: the
// delivered prefix is purged with no "purge failed" (which each try's
// jswire.OpTimeout used to end in).
// Orderings only: the minute is a liveness bound.
func TestPurgeLeaderRequestsSentAgain(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "TGT", Subjects: []string{"tgt.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 10
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	due := contract.FormatTime(time.Now().Add(-time.Minute))
	for i := range n {
		h := nats.Header{contract.HeaderDueAt: {due}, message.HdrIngress: {fmt.Sprintf("delayd-1-%d", i+1)}}
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(fmt.Sprintf("m-%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	targets := target.New(b.nc, b.js, nil)
	if err := targets.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	logs := &messageCounter{msg: "purge failed"}
	s, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: targets, Logger: slog.New(logs)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	tries := map[string]int{}
	lost := map[string]context.Context{} // each op's lost try's context
	late := map[string]bool{}            // the op's second try was sent after its lost try had given up
	s.hooks.losePurge = func(ctx context.Context, op string) bool {
		mu.Lock()
		defer mu.Unlock()
		tries[op]++
		switch tries[op] {
		case 1:
			lost[op] = ctx
			return true
		case 2:
			late[op] = lost[op].Err() != nil
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

	ls, err := b.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		info, err := ls.Info(ctx)
		if err == nil && info.State.FirstSeq >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute %s was not purged up to %d (info %+v, error %v; stats %+v)", stream, n, info, err, s.Stats())
		}
	}
	mu.Lock()
	for _, op := range []string{"info", "purge"} {
		if tries[op] < 2 {
			t.Errorf("the purge's %s was tried %d times, want its first try lost and a second: this run does not test it", op, tries[op])
		} else if late[op] {
			// A try of a later call, not a copy: the lost one held the
			// scanner for its whole jswire.OpTimeout.
			t.Errorf("the %s's second try was sent after its lost try had given up, want it sent again while that one waited", op)
		}
	}
	mu.Unlock()
	if got := logs.n.Load(); got != 0 {
		t.Errorf("%d purges failed, want none (each unanswered request sent again)", got)
	}
}
