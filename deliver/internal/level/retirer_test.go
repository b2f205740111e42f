package level

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// TestIdleLevelRetiresSkippedTombstone: a level that skips a cancelled
// message and then has nothing more to do still retires its tombstone
// once the offset commit past it is acknowledged, though no later commit
// comes. The cancelled message is the first of a new level stream, so the
// level's purged prefix (its first sequence at the load) already reaches
// the committed offset when it goes idle: no purge is due, and the idle
// loop must still wait for the commit for the tombstone's sake.
func TestIdleLevelRetiresSkippedTombstone(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(time.Now().Add(-time.Minute))}, message.HdrMsgID: {"x"}}
	ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	seq := ack.Sequence
	// Cancelled before the term loads: its tombstone is stored.
	tomb := index.Tombstone{Seq: seq, Key: index.UserKey("x")}
	tack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: index.TombstoneSubject(stream), Data: tomb.Encode()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(b.nc, b.js, Config{Stream: stream, Offsets: store, Targets: target.New(b.nc, b.js, nil)},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
	if err != nil {
		t.Fatal(err)
	}
	tctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.RunTerm(tctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()

	// A liveness bound, not a property: the commit is acknowledged at
	// once, and the idle loop waits PurgeEvery (1 s) before it looks.
	for deadline := time.Now().Add(30 * time.Second); l.Cancelled(seq) || l.Passed() < seq; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tombstone of %d still held 30 s after the term began (passed %d, committed %d, acknowledged %d)",
				seq, l.Passed(), l.commits.Committed(), l.commits.Stored())
		}
	}
	tombs, err := b.js.Stream(ctx, index.CancelStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tombs.GetMsg(ctx, tack.Sequence); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the tombstone's message %d in %s: %v; want it deleted", tack.Sequence, index.CancelStream, err)
	}
}
