package deliver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// publishIDs publishes n messages with ids prefix-0 … to delay.<target>
// at level 1 and returns the id index's last sequence once it holds
// their records (the router wrote them).
func (b *ownerBundle) publishIDs(target, prefix string, n int) uint64 {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := b.js.Stream(ctx, IndexStream)
	if err != nil {
		b.t.Fatal(err)
	}
	before := st.CachedInfo().State.Msgs
	for i := range n {
		h := nats.Header{}
		h.Set("Delay-Level", "1")
		h.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", prefix, i))
		b.publishTo(target, fmt.Sprintf("%s-%d", prefix, i), h)
	}
	for {
		info, err := st.Info(ctx)
		if err != nil {
			b.t.Fatalf("index info: %v", err)
		}
		if info.State.Msgs > before {
			// One index message holds the records of one or more
			// messages: wait a little for the router's last batch.
			time.Sleep(200 * time.Millisecond)
			if info, err = st.Info(ctx); err != nil {
				b.t.Fatalf("index info: %v", err)
			}
			return info.State.LastSeq
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTrimmedPast waits (a minute at most) until the id index's first
// sequence is beyond last: the trim purged every record up to it.
func (b *ownerBundle) waitTrimmedPast(last uint64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := b.js.Stream(ctx, IndexStream)
	if err != nil {
		b.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := st.Info(ctx)
		if err == nil && info.State.FirstSeq > last {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the id index still holds sequence %d (first %d) after a minute: the trim is held back", last, info.State.FirstSeq)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnswersNeverHoldTrim: when kept answers cannot keep up (here a trim
// pass may spend no time on them: passMax 0), the id index trim does not
// wait for them beyond their bound (lagMax, 1 s here): the records go
// unanswered, and are counted as skipped. Without the bound, the index
// would grow for ever behind the answers.
func TestAnswersNeverHoldTrim(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	r := b.launch("R0", Config{Levels: levels.MustParse(ownerLevels), IndexKeep: 400 * time.Millisecond}, func(s *Service) {
		s.answers.work.bounds.passMax, s.answers.work.bounds.lagMax = 0, time.Second
	})
	waitReady(t, r)
	last := b.publishIDs("held.x", "held", 50)
	b.waitTrimmedPast(last)
	st := r.svc.AnswerStats()
	if st.Skipped == 0 {
		t.Errorf("the index was trimmed past %d with no answers kept, but AnswerStats().Skipped = 0", last)
	}
	if st.Kept != 0 {
		t.Errorf("AnswerStats().Kept = %d with a pass bound of 0: want none kept", st.Kept)
	}
}

// TestAnswerKeepOff: with kept answers off, the trim purges the id index
// as before kept answers (about IndexKeep after a message left its
// level), DELAYD_ANSWERS is never created, and a trimmed id answers "not
// found".
func TestAnswerKeepOff(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	r := b.launch("R0", Config{Levels: levels.MustParse(ownerLevels), IndexKeep: 400 * time.Millisecond, AnswerKeep: AnswerKeepOff})
	waitReady(t, r)
	last := b.publishIDs("off.x", "off", 20)
	b.waitTrimmedPast(last)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.js.Stream(ctx, AnswerStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s with kept answers off: %v, want %v", AnswerStream, err, jetstream.ErrStreamNotFound)
	}
	if st := r.svc.AnswerStats(); st.Kept != 0 || st.Skipped != 0 {
		t.Errorf("AnswerStats() = %+v with kept answers off, want zero", st)
	}
	m, err := b.nc.Request(contract.CancelSubjectFor("off.x"), []byte("off-3"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyNotFound {
		var body string
		if m != nil {
			body = string(m.Data)
		}
		t.Errorf("cancel off-3 (delivered, its records trimmed, answers off): %q, %v; want %q", body, err, contract.CancelReplyNotFound)
	}
}

// TestAnswersRangeBound: when kept answers cannot keep up, the trim
// purges all but the newest rangeMax index messages of its range without
// their answers, however recent the rest (lagMax an hour here).
func TestAnswersRangeBound(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	r := b.launch("R0", Config{Levels: levels.MustParse(ownerLevels), IndexKeep: 400 * time.Millisecond}, func(s *Service) {
		s.answers.work.bounds.passMax, s.answers.work.bounds.lagMax, s.answers.work.bounds.rangeMax = 0, time.Hour, 3
	})
	waitReady(t, r)
	last := b.publishIDs("range.x", "range", 50)
	b.waitTrimmedPast(last - 3)
	if st := r.svc.AnswerStats(); st.Skipped == 0 || st.Kept != 0 {
		t.Errorf("AnswerStats() = %+v after a trim past %d with a pass bound of 0: want some skipped, none kept", st, last-3)
	}
}
