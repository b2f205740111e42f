package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// mover.go: finishing a move whose intent is stored but whose new message
// is not known to be (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover).
// Built so far: the mover for intents loaded by a term (the workers'
// moves, completeMove, are next: docs/pending.md#7-progress).

// moveAction is what the mover does with one moving intent.
type moveAction int

const (
	// moveRetry: whether the new message is stored is not known (the
	// router is behind, a read failed): look again later; the head stays
	// held.
	moveRetry moveAction = iota
	// movePlace: the new message is stored: write the placed mark, and
	// the old message is skipped (book.placed).
	movePlace
	// moveVoid: no new message, and the old one may have been handed off
	// before this term (by an owner that did not know the intent): delete
	// the intent and deliver the old one as usual (book.void).
	moveVoid
	// moveWrite: no new message, and nobody handed the old one off:
	// write it, then the placed mark.
	moveWrite
)

// moveFacts is what the mover knows of one moving intent when it decides.
type moveFacts struct {
	// exists and known are newExists' answer: known false when it could
	// not tell; exists true when the new message is stored.
	exists, known bool
	// seq is the moved sequence, oldDue the old message's level due
	// (message.LevelDue: when its level hands it off).
	seq    uint64
	oldDue time.Time
	// loadTail and loadedAt are the term's load's (owner.life): a
	// sequence at or below loadTail due by loadedAt (with a second's
	// slack, as completeCancel's check) may have been handed off before
	// the load by an owner whose offset commit was lost.
	loadTail uint64
	loadedAt time.Time
}

// action is §2.4's decision: a stored new message wins whatever the old
// due (the answer "rescheduled" may have been given); without one, the old
// message is voided only if it may have been handed off, and written again
// otherwise.
func (f moveFacts) action() moveAction {
	switch {
	case !f.known:
		return moveRetry
	case f.exists:
		return movePlace
	case f.seq <= f.loadTail && !f.oldDue.After(f.loadedAt.Add(time.Second)):
		return moveVoid
	}
	return moveWrite
}

// moveJob is one moving intent handed to the mover, with what the term's
// load knew (read on the loop, so the mover reads no loop-owned field).
type moveJob struct {
	t        index.Tombstone
	loadTail uint64
	loadedAt time.Time
	term     ownership.Term // the term that loaded it: N is written only while it owns the level
}

// mover finishes moving intents off the owner's loop: one per term, on a
// goroutine of its own (docs/reshape.md#24-one-goroutine-per-owner-two-per-type-at-most), started by owner.run next to
// the retirer and stopped before run returns. The loop hands it, after
// each load, every loaded intent above the offset whose new message is not
// known to be stored; for each it decides ([moveFacts.action]) and writes
// the placed mark (the head is then skipped), voids the intent (the head
// is delivered as usual), or writes the new message and then the mark,
// retrying with backoff until the intent is settled or the term ends. A
// moving head waits for it (owner.awaitMove).
type mover struct {
	lvl  *Level
	stop context.CancelFunc
	done chan struct{} // closed when run has returned
	wake chan struct{} // a job arrived (capacity 1)

	mu   sync.Mutex
	jobs []moveJob
}

// startMover starts l's mover on a goroutine of its own, until ctx is done
// or Stop is called.
func startMover(ctx context.Context, l *Level) *mover {
	ctx, cancel := context.WithCancel(ctx)
	m := &mover{lvl: l, stop: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go func() { defer close(m.done); m.run(ctx) }()
	return m
}

// Stop stops the mover and waits for its goroutine; unsettled intents
// stay stored, for the next owner's load.
func (m *mover) Stop() {
	m.stop()
	<-m.done
}

// add hands jobs to the mover (any goroutine).
func (m *mover) add(jobs ...moveJob) {
	if len(jobs) == 0 {
		return
	}
	m.mu.Lock()
	m.jobs = append(m.jobs, jobs...)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run settles the jobs until ctx is done; those not settled are tried
// again after a backoff.
func (m *mover) run(ctx context.Context) {
	l := m.lvl
	reader, err := jswire.NewBatchReader(l.deps.nc, index.Batch)
	if err != nil {
		l.logger.Error("mover", slog.Any("error", err))
		return
	}
	defer reader.Close()
	retry := backoff.New(50*time.Millisecond, 2*time.Second)
	var left []moveJob
	for {
		m.mu.Lock()
		jobs := append(left, m.jobs...)
		m.jobs = nil
		m.mu.Unlock()
		left = nil
		for _, j := range jobs {
			settled, err := m.settle(ctx, reader, j)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				l.logger.Warn("move not settled yet; retrying", slog.Uint64("seq", j.t.Seq), slog.Any("error", err))
			}
			if !settled {
				left = append(left, j)
			}
		}
		if len(left) > 0 {
			if !retry.Sleep(ctx) {
				return
			}
			continue
		}
		retry.Reset()
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
	}
}

// settle decides j's intent and acts; settled false to try again.
func (m *mover) settle(ctx context.Context, reader *jswire.BatchReader, j moveJob) (settled bool, err error) {
	l := m.lvl
	t := j.t
	if st, cur, _ := l.cancel.book.state(t.Seq); st != stateMoving || cur.At != t.At {
		return true, nil // placed, voided, retired, or another tombstone of it since
	}
	rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	buf, err := reader.Read(rctx, l.cfg.Stream, nil, t.Seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(buf) == 0 || buf[0].Header.Get(message.HdrJSSequence) != strconv.FormatUint(t.Seq, 10) || message.LevelKey(buf[0].Header) != t.Key {
		// Not the message the intent was written for: nothing to move
		// (skipCancelled delivers a mismatched one the same way).
		return true, l.voidMove(rctx, t)
	}
	old := buf[0]
	oldDue, _ := message.LevelDue(old.Header)
	exists, known, err := l.newExists(rctx, reader, t)
	if err != nil {
		return false, err
	}
	switch (moveFacts{exists: exists, known: known, seq: t.Seq, oldDue: oldDue, loadTail: j.loadTail, loadedAt: j.loadedAt}).action() {
	case moveRetry:
		return false, nil
	case moveVoid:
		l.logger.Info("move voided: its new message was never written, and the old one may have been delivered; delivering it as usual", slog.Uint64("seq", t.Seq))
		return true, l.voidMove(rctx, t)
	case moveWrite:
		if err := l.confirmOwner(rctx, j.term); err != nil {
			return false, err
		}
		if err := l.writeMoved(rctx, old, t); err != nil {
			return false, err
		}
	}
	return true, l.placeMove(rctx, t)
}

// newExists reports whether the new message of t's move is stored and
// routed: once the router has placed everything published before now
// (Wiring.Routed), the id's latest index record is another placement than
// the old one, or says it is gone (cancelled, delivered): only the new
// message can have made it. known is false when the router is behind, and
// without Wiring.Routed: a record read before the router placed a stored
// new message would void a move already made (two deliveries).
func (s *Level) newExists(ctx context.Context, reader *jswire.BatchReader, t index.Tombstone) (exists, known bool, err error) {
	if s.cfg.Routed == nil {
		return false, false, nil
	}
	if caughtUp, err := s.cfg.Routed(ctx); err != nil || !caughtUp {
		return false, false, err
	}
	rec, ok, err := index.LookupLatest(ctx, s.deps.nc, reader, t.Key, jswire.OpTimeout, nil)
	if err != nil {
		return false, false, err
	}
	return ok && (rec.Gone || rec.Stream != s.cfg.Stream || rec.Seq != t.Seq), true, nil
}

// writeMoved publishes the new message of t's move: old (as read from the
// level stream) again to ingress, due at t.Move, built as a hop is
// (buildHop), signed, with the move's id (hop.Key.MoveID: every copy is
// one stored message).
func (s *Level) writeMoved(ctx context.Context, old *nats.Msg, t index.Tombstone) error {
	h := old.Header
	target := strings.TrimPrefix(h.Get(message.HdrJSSubject), s.cfg.subject)
	origin := h.Get(message.HdrOrigin)
	if origin == "" {
		origin = h.Get(message.HdrIngress)
	}
	hops, _ := strconv.Atoi(h.Get(message.HdrHops))
	buildHop(h, origin, hops, t.Move)
	moves, _ := strconv.Atoi(h.Get(message.HdrMoves)) // buildHop keeps the old message's count
	h[message.HdrMoves] = []string{strconv.Itoa(moves + 1)}
	h[contract.HeaderNatsMsgID] = []string{s.cfg.HopKey.MoveID(origin, s.cfg.Stream, t.Seq)}
	out := &nats.Msg{Subject: s.cfg.Prefix + "." + target, Header: h, Data: old.Data}
	s.cfg.HopKey.Sign(out.Subject, h)
	if _, err := s.deps.js.PublishMsg(ctx, out); err != nil {
		return fmt.Errorf("moved message: %w", err)
	}
	return nil
}

// placeMove writes the placed mark of t's move and records it moved: the
// old message is skipped.
func (s *Level) placeMove(ctx context.Context, t index.Tombstone) error {
	ack, err := s.deps.js.PublishMsg(ctx, index.PlacedMark{Intent: t.At}.Msg(s.cfg.Stream))
	if err != nil {
		return fmt.Errorf("placed mark: %w", err)
	}
	s.cancel.book.placed(t.Seq, t.At, ack.Sequence)
	return nil
}

// voidMove deletes t's intent and frees its sequence: the old message is
// delivered as usual.
func (s *Level) voidMove(ctx context.Context, t index.Tombstone) error {
	st, err := s.deps.js.Stream(ctx, index.CancelStream)
	if err != nil {
		return fmt.Errorf("move intent: %w", err)
	}
	if err := st.DeleteMsg(ctx, t.At); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("move intent: %w", err)
	}
	s.cancel.book.void(t.Seq, t.At)
	return nil
}
