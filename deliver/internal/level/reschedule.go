package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// reschedule.go: a worker's move of one reserved message
// (docs/pending.md#22-the-writes-in-order). The owner's loop reserves the
// sequence as for a cancel ([owner.reserve]); the writes happen here, on
// the asker's goroutine (a cancel worker, or the decide server's), in the
// owner's process.

// errMoveUnconfirmed is a reschedule's answer when its intent is stored
// and fenced but its new message could not be confirmed stored in time
// (or the fence could not be read): the term's mover finishes it (writes
// the new message, or finds it stored), so the message is delivered once,
// at its new due; or, if the term ends first, the next owner's mover
// settles it (docs/pending.md#25-safety-delivered-once-at-the-old-due-or-once-at-the-new-one).
var errMoveUnconfirmed = errors.New("reschedule stored but not confirmed yet; ask its status")

// completeMove does a reserved reschedule's I/O on the requester's
// goroutine: the message rec places is moved to due, a server time.
//
//  1. The check of [Level.completeCancel]: the message at the sequence is
//     the one asked for (else AnswerGone), and not perhaps delivered
//     before a crash (else handed off).
//  2. T, the intent: a tombstone with due in Delayd-Move-Due, waiting for
//     its PubAck.
//  3. The reservation becomes a moving entry (the scanner holds the
//     sequence); if it had expired (the scanner delivered the message),
//     T is deleted and the answer is handed off.
//  4. The fence ([Level.confirmOwner]): if the term ended, its error
//     (wrapping ownership.ErrNotOwner: ask the next owner), and no new
//     message is written; T stays, for the next owner's mover.
//  5. N, the new message ([Level.writeMoved]), in tries of
//     jswire.WriteAttempt up to jswire.OpTimeout, each copy with the
//     move's Nats-Msg-Id.
//  6. AnswerRescheduled, once N's PubAck is in.
//  7. C, the placed mark, best effort: the entry is moved (skipped) either
//     way; a later load writes a missing C.
//
// If the fence cannot be read (step 4, other than not owner) or N is not
// confirmed within its bound (step 5), the move is handed to the term's
// mover (d.mover) and errMoveUnconfirmed is returned (a 500 to the
// requester): the entry stays moving, its head held, until the mover
// settles it.
func (s *Level) completeMove(ctx context.Context, reader *jswire.BatchReader, rec index.Record, d cancelDecision, due time.Time) (CancelAnswer, error) {
	r := d.res
	kept := false
	defer func() {
		if !kept {
			s.cancel.book.release(r)
		}
	}()
	rctx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()
	old, answer, ok, err := s.checkReserved(rctx, reader, rec, d)
	if !ok {
		return answer, err
	}
	t := s.tombstoneOf(rec, old)
	t.Move = due.UTC()
	ack, err := s.deps.js.PublishMsg(rctx, t.Msg(s.cfg.Stream))
	if err != nil {
		return 0, fmt.Errorf("move intent: %w", err)
	}
	t.At = ack.Sequence
	if kept = s.cancel.book.resolveMove(r, t); !kept {
		// The scanner waited past the deadline and took the sequence
		// back: it is delivered. The late intent must not move it after a
		// restart.
		s.logger.Warn("move intent stored after its deadline; the message is delivered", slog.Uint64("seq", rec.Seq))
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
		defer cancel()
		if st, err := s.deps.js.Stream(dctx, index.CancelStream); err == nil {
			_ = st.DeleteMsg(dctx, t.At)
		}
		return handedOff(rec), nil
	}
	unconfirmed := func(cause error) (CancelAnswer, error) {
		s.logger.Warn("move intent stored, its new message not confirmed; the mover finishes it", slog.Uint64("seq", rec.Seq), slog.Any("error", cause))
		if d.mover != nil {
			d.mover.add(moveJob{t: t, loadTail: d.loadTail, loadedAt: d.loadedAt, term: d.term})
		}
		return 0, errMoveUnconfirmed
	}
	if err := s.confirmOwner(ctx, d.term); err != nil {
		if !errors.Is(err, ownership.ErrNotOwner) {
			return unconfirmed(err)
		}
		// T stays: the next owner loads it and its mover settles it.
		s.logger.Warn("move intent stored, but the level's term ended meanwhile; the reschedule is asked of the next owner", slog.Uint64("seq", rec.Seq), slog.Any("error", err))
		return 0, err
	}
	if err := s.writeMovedTries(ctx, old, t); err != nil {
		return unconfirmed(err)
	}
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
	defer ccancel()
	if err := s.placeMove(cctx, t); err != nil {
		// N is stored: the old message is skipped all the same; the next
		// load finds T without C and its mover writes C.
		s.cancel.book.placed(t.Seq, t.At, 0)
		s.logger.Warn("placed mark not written; the next load writes it", slog.Uint64("seq", rec.Seq), slog.Any("error", err))
	}
	s.logger.Debug("message rescheduled", slog.Uint64("seq", rec.Seq), slog.String("key", rec.Key[1:]), slog.Time("due", t.Move))
	return AnswerRescheduled, nil
}

// writeMovedTries writes the new message of t's move ([Level.writeMoved])
// in tries of jswire.WriteAttempt until one is answered, up to
// jswire.OpTimeout (or ctx): every copy carries the move's Nats-Msg-Id, so
// the ingress stream stores one (a duplicate's PubAck counts: an earlier
// copy is stored).
func (s *Level) writeMovedTries(ctx context.Context, old *nats.Msg, t index.Tombstone) error {
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, jswire.WriteAttempt)
		err := s.writeMoved(actx, copyMsg(old), t)
		acancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("moved message: %w", err)
		}
	}
}

// copyMsg returns a copy of m whose header may be changed (writeMoved
// rebuilds the header it is given).
func copyMsg(m *nats.Msg) *nats.Msg {
	c := *m
	c.Header = make(nats.Header, len(m.Header))
	for k, v := range m.Header {
		c.Header[k] = append([]string(nil), v...)
	}
	return &c
}

// checkReserved reads the message at rec's reserved sequence (a cancel's
// or a move's first step) and reports ok with it if it is the one asked
// for and may be changed. Otherwise answer (or err) is the request's: not
// stored yet (AnswerRetry), another message (AnswerGone), or due before the
// scanner (re)loaded (handed off: perhaps delivered before a crash, its
// offset not committed, so it is delivered again as usual).
func (s *Level) checkReserved(ctx context.Context, reader *jswire.BatchReader, rec index.Record, d cancelDecision) (m *nats.Msg, answer CancelAnswer, ok bool, err error) {
	buf, err := reader.Read(ctx, s.cfg.Stream, nil, rec.Seq, 1, 1)
	switch {
	case err != nil:
		return nil, 0, false, err
	case len(buf) == 0:
		return nil, AnswerRetry, false, nil // the level write is not stored yet
	case buf[0].Header.Get(message.HdrJSSequence) != strconv.FormatUint(rec.Seq, 10) || message.LevelKey(buf[0].Header) != rec.Key:
		return nil, AnswerGone, false, nil
	}
	m = buf[0]
	if due, _ := message.LevelDue(m.Header); rec.Seq <= d.loadTail && !due.After(d.loadedAt.Add(time.Second)) {
		return nil, handedOff(rec), false, nil // perhaps delivered before a crash
	}
	return m, 0, true, nil
}

// tombstoneOf is the tombstone of the message m that rec places: its
// sequence, id key, target and merge key.
func (s *Level) tombstoneOf(rec index.Record, m *nats.Msg) index.Tombstone {
	t := index.Tombstone{Seq: rec.Seq, Key: rec.Key, Target: strings.TrimPrefix(m.Header.Get(message.HdrJSSubject), s.cfg.subject)}
	if mk := m.Header.Get(message.HdrMerge); mk != "" {
		t.MergeKey = index.MergeKey(t.Target, mk)
	}
	return t
}
