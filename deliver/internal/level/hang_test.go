package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/levels"
)

// TestLoadReadSentAgain: the replies to the first direct get of a term's
// load (the tombstone walk's first read) never arrive, as if a replica that
// hangs had the request. The read is sent again and answered, and the term
// loads at its first try: no "scanner start failed". Seen to fail with the
// resend turned off (as the owner's reader was before it was the default):
// the read waited out jswire.OpTimeout, the load failed and was tried again.
// Orderings only: the minute is a liveness bound.
func TestLoadReadSentAgain(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	logs := &messageCounter{msg: "scanner start failed; retrying"}
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil), Logger: slog.New(logs)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	l.hooks.loseReads = func(n uint64) bool {
		if n == 1 {
			lost.Add(1)
			return true
		}
		return false
	}
	tctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.RunTerm(tctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()
	for !l.Loaded() {
		if ctx.Err() != nil {
			t.Fatalf("not loaded within a minute (start failures %d)", logs.n.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if lost.Load() != 1 {
		t.Fatalf("%d reads lost, want 1: this run does not test a lost read", lost.Load())
	}
	if n := logs.n.Load(); n != 0 {
		t.Fatalf("%d failed starts before the load; want the first to load, its lost read sent again", n)
	}
}

// messageCounter is a slog handler counting the records whose message is
// msg.
type messageCounter struct {
	msg string
	n   atomic.Int64
}

func (h *messageCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *messageCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}

func (h *messageCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *messageCounter) WithGroup(string) slog.Handler      { return h }

// TestStartRetryCapped: the owner's wait before another try grows to the
// backoff's 5 s cap for failures that were answered, and stays at most
// hedge.AfterLeader for requests nobody answered (a timeout, no
// responders, a leaderless stream, a silent consumer): an election's end
// is noticed within a second. Seen to fail with one backoff for all: the
// waits after timeouts grew past a second.
func TestStartRetryCapped(t *testing.T) {
	t.Parallel()
	r := newStartRetry()
	for _, err := range []error{
		fmt.Errorf("level stream: %w", context.DeadlineExceeded),
		fmt.Errorf("cancel tombstones: %w", nats.ErrNoResponders),
		errLeaderless,
		jswire.ErrNoHeartbeat,
	} {
		for i := range 20 {
			if d := r.next(err); d > hedge.AfterLeader {
				t.Fatalf("wait %d after %v: %s, want at most %s", i, err, d, hedge.AfterLeader)
			}
		}
	}
	var longest time.Duration
	for range 20 {
		longest = max(longest, r.next(errors.New("refused")))
	}
	if longest <= hedge.AfterLeader {
		t.Fatalf("longest wait after answered failures %s, want the backoff to grow past %s", longest, hedge.AfterLeader)
	}
	r.reset()
	if d := r.next(errors.New("refused")); d > 100*time.Millisecond {
		t.Fatalf("after a success: %s, want the 100ms minimum", d)
	}
}
