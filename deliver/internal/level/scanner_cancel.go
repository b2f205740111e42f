package level

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// request is a question another goroutine asks the owner's loop, on
// owner.asks: a cancel to decide (and reserve for), or a status.
type request struct {
	rec   index.Record
	ask   Ask // AskStatus: decide, reserve nothing
	reply chan cancelDecision
}

// cancelDecision is the scanner goroutine's answer to a request. With
// answerReserved, res is the sequence's reservation, and loadTail and
// loadedAt are the scanner's, to tell a message perhaps delivered before
// a crash (see [Level.completeCancel]). With AnswerRetry and a non-nil
// wait, another cancel of the sequence is in flight: ask again once wait
// is closed.
type cancelDecision struct {
	answer   CancelAnswer
	res      *reservation
	wait     <-chan struct{}
	loadTail uint64
	loadedAt time.Time
	term     ownership.Term // the term that reserved it, for the fenced check (Level.confirmOwner)
	// mover is the term's mover (answerReserved only): a reschedule whose
	// new message is not confirmed stored hands it its move
	// (Level.completeMove).
	mover *mover
}

// answerReserved is a decision only the owner's loop gives to a cancel:
// the sequence is not passed and is reserved for the requester's I/O.
const answerReserved CancelAnswer = -1

// reservationSlack is how long past a reservation's deadline the scanner waits
// for its outcome before it takes the sequence back and delivers it.
const reservationSlack = time.Second

// clip quotes at most n bytes of b for a log line.
func clip(b []byte, n int) string {
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "…"
	}
	return strconv.Quote(string(b))
}

// request cancels the message rec places in this level (or, with
// AskStatus, tells its status), on the caller's goroutine (a cancel
// worker), reading with reader ([local.Decide]). It asks the current term's
// owner (the term slot's): between terms it returns an error wrapping
// ownership.ErrNotOwner, to send again.
//
// The owner's loop only decides, between two deliveries, whether the
// sequence is passed (handed off: the answer) or not; if not, it reserves
// the sequence, and the I/O (the read that checks the message, the
// tombstone write and its PubAck) happens here, so a slow write holds no
// delivery but this message's own. A message is either handed to its
// target or cancelled, never both
// (docs/guarantees.md#delivered-xor-cancelled). A status request is
// decided as a cancel but reserves nothing, so a message not handed off
// and not cancelled answers AnswerPending and is delivered as usual; a
// cancel in flight is waited for, and "cancelled" holds only after the
// same fenced check as a cancel's.
func (s *Level) request(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error) {
	o := s.slot.get()
	if o == nil {
		return 0, fmt.Errorf("level stream %s: %w; send the cancel again", s.cfg.Stream, ownership.ErrNotOwner)
	}
	return o.ask(ctx, reader, rec, ask)
}

// ask has this owner's loop decide rec's cancel (or, with AskStatus, its
// status; with AskReschedule, its move) and completes a reserved cancel
// ([Level.completeCancel]) or move ([Level.completeMove]) on the caller's
// goroutine. An
// owner whose term ends stops deciding: the asker sees its done channel
// and gives up with an error wrapping ownership.ErrNotOwner, to send again (to the
// next owner).
func (s *owner) ask(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error) {
	stopped := fmt.Errorf("level stream %s: %w; send the cancel again", s.cfg.Stream, ownership.ErrNotOwner)
	for {
		req := request{rec: rec, ask: ask, reply: make(chan cancelDecision, 1)}
		select {
		case s.asks <- req:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-s.done:
			return 0, stopped
		}
		s.nudge()
		var d cancelDecision
		select {
		case d = <-req.reply:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-s.done:
			select {
			case d = <-req.reply: // decided just before the loop returned
			default:
				// Never decided: the next owner decides it when asked
				// again (a reservation nobody completes is taken back
				// after its deadline, like any other).
				return 0, stopped
			}
		}
		switch {
		case d.answer == answerReserved && ask.Op == AskReschedule:
			return s.completeMove(ctx, reader, rec, d, ask.Due)
		case d.answer == answerReserved:
			return s.completeCancel(ctx, reader, rec, d)
		case d.answer == AnswerRetry && d.wait != nil:
			// Another cancel of this sequence is writing: its outcome
			// decides this one.
			select {
			case <-d.wait:
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		case d.answer == AnswerCancelled:
			// A tombstone this process holds: "cancelled" holds only
			// while this term owns the level (the next owner may not
			// have loaded it), as for a tombstone just written.
			if err := s.confirmOwner(ctx, d.term); err != nil {
				return 0, err
			}
			return d.answer, nil
		default:
			return d.answer, nil
		}
	}
}

// nudge wakes the scanner from a wait.
func (s *owner) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// serveCancels decides the queued cancel requests. It runs on the
// scanner's goroutine and does no I/O.
func (s *owner) serveCancels() {
	for {
		select {
		case req := <-s.asks:
			req.reply <- s.reserve(req.rec, req.ask)
		default:
			return
		}
	}
}

// reserve runs on the scanner's goroutine, between two deliveries. A
// sequence below next has been handed off (delivered, or forwarded to its
// next level); so may have one retried after an ambiguous failure: those
// answer as handed off and are delivered (again) as usual. A cancelled,
// moving, moved or reserved one answers from [cancelBook] (moving and
// moved: AnswerForwarded, look again where its move placed it). Any other
// is reserved: the scanner does not pass it until the requester's
// tombstone write has an outcome ([Level.awaitCancel]); for a status
// request it answers AnswerPending instead.
func (s *owner) reserve(rec index.Record, ask Ask) cancelDecision {
	seq := rec.Seq
	switch st, _, r := s.cancel.book.state(seq); st {
	case stateCancelled:
		return cancelDecision{answer: AnswerCancelled, term: s.term}
	case stateMoving, stateMoved:
		// Moved, or being moved: its new placement answers (the asker
		// looks the id up again, as for a hop).
		return cancelDecision{answer: AnswerForwarded}
	case stateReserved:
		return cancelDecision{answer: AnswerRetry, wait: r.done}
	}
	if seq < s.pos.next || s.conf.win.tried(seq) {
		return cancelDecision{answer: handedOff(rec)}
	}
	if ask.Op == AskStatus {
		return cancelDecision{answer: AnswerPending}
	}
	return cancelDecision{
		answer:   answerReserved,
		res:      s.cancel.book.reserve(seq, time.Now().Add(jswire.OpTimeout)),
		loadTail: s.life.loadTail,
		loadedAt: s.life.loadedAt,
		term:     s.term,
		mover:    s.io.mover,
	}
}

// handedOff is the answer for a message rec places that left this level.
func handedOff(rec index.Record) CancelAnswer {
	if rec.Hop {
		return AnswerForwarded
	}
	return AnswerDelivered
}

// completeCancel does a reserved cancel's I/O on the requester's
// goroutine, by the reservation's deadline. The record names a sequence
// the router predicted: the message there is checked to be the one asked
// for. One that was due before the scanner (re)loaded may have been
// delivered before a crash, its offset not committed: it answers as handed
// off and is delivered (again) as usual. Otherwise a durable tombstone is
// written (waiting for its PubAck), and only then does the reservation
// become the tombstone; the answer is "cancelled" only once a fenced
// check ([Level.confirmOwner]) shows that the term that reserved it
// still owns the level, so that every later owner loads the tombstone.
// A failed check returns an error wrapping ownership.ErrNotOwner: the cancel is
// asked again of the level's next owner, which answers from the
// tombstone if it loaded it, and decides afresh if not. If anything else
// fails, the reservation is released and the message is delivered as
// usual.
func (s *Level) completeCancel(ctx context.Context, reader *jswire.BatchReader, rec index.Record, d cancelDecision) (answer CancelAnswer, err error) {
	r := d.res
	kept := false
	defer func() {
		if !kept {
			s.cancel.book.release(r)
		}
	}()
	rctx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()
	m, answer, ok, err := s.checkReserved(rctx, reader, rec, d)
	if !ok {
		return answer, err
	}
	t := s.tombstoneOf(rec, m)
	ack, err := s.deps.js.PublishMsg(rctx, &nats.Msg{Subject: index.TombstoneSubject(s.cfg.Stream), Data: t.Encode()})
	if err != nil {
		return 0, fmt.Errorf("cancel tombstone: %w", err)
	}
	t.At = ack.Sequence
	if kept = s.cancel.book.resolve(r, t); !kept {
		// The scanner waited past the deadline and took the sequence
		// back: it is delivered. The late tombstone must not cancel a
		// delivery again after a restart.
		s.logger.Warn("cancel tombstone stored after its deadline; the message is delivered", slog.Uint64("seq", rec.Seq))
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
		defer cancel()
		if st, err := s.deps.js.Stream(dctx, index.CancelStream); err == nil {
			_ = st.DeleteMsg(dctx, t.At)
		}
		return handedOff(rec), nil
	}
	if err := s.confirmOwner(ctx, d.term); err != nil {
		// The tombstone stays (a later owner that loads it skips the
		// message), but nothing is answered or indexed as cancelled.
		s.logger.Warn("cancel tombstone stored, but the level's term ended meanwhile; the cancel is asked of the next owner", slog.Uint64("seq", rec.Seq), slog.Any("error", err))
		return 0, err
	}
	s.stats.cancelledN.Add(1)
	// Later cancels of this id answer from the index, also once the
	// tombstone is gone, and its merge key is free. (If this fails, the
	// janitor writes them before it deletes the tombstone.)
	ictx, icancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
	defer icancel()
	if s.writeGone(ictx, t) == nil {
		s.cancel.book.markIndexed(t.Seq)
	}
	s.logger.Debug("message cancelled", slog.Uint64("seq", rec.Seq), slog.String("key", rec.Key[1:]))
	return AnswerCancelled, nil
}

// awaitCancel waits, on the scanner's goroutine, for the outcome of the
// cancel that reserved the due head r.seq: until it is resolved or
// released, a cancel request arrives (to be decided), ctx is done, or r's
// deadline plus reservationSlack passes; then the scanner takes the sequence
// back and delivers it (the late tombstone is not taken). It never does
// the cancel's I/O itself.
func (s *owner) awaitCancel(ctx context.Context, r *reservation) {
	t := time.NewTimer(time.Until(r.deadline) + reservationSlack)
	defer t.Stop()
	select {
	case <-r.done:
	case <-s.wake:
	case <-ctx.Done():
	case <-t.C:
		if s.cancel.book.expire(r) {
			s.logger.Warn("cancel tombstone write not answered in time; delivering", slog.Uint64("seq", r.seq))
		}
	}
}

// writeGone writes the "cancelled" index records of t, and tells the router
// its merge key is free.
func (s *Level) writeGone(ctx context.Context, t index.Tombstone) error {
	for _, key := range []string{t.Key, t.MergeKey} {
		if key == "" {
			continue
		}
		if _, err := s.deps.js.PublishMsg(ctx, index.Record{Key: key, Gone: true, Target: t.Target}.Msg()); err != nil {
			s.logger.Warn("id index write failed", slog.Any("error", err))
			return err
		}
	}
	if t.MergeKey != "" && s.cfg.MergeGone != nil {
		s.cfg.MergeGone(index.Record{Key: t.MergeKey, Gone: true, Target: t.Target})
	}
	return nil
}

// skipCancelled reports whether the head at seq is cancelled, or moved
// (its move's new message is stored), and if so passes it without
// delivering it. A moving head is not passed: cancelHolds holds it.
func (s *owner) skipCancelled(m *nats.Msg, seq uint64) bool {
	st, t, _ := s.cancel.book.state(seq)
	if st != stateCancelled && st != stateMoved {
		return false
	}
	if t.Key != message.LevelKey(m.Header) {
		// Not the message the tombstone was written for (a stream deleted
		// and recreated under it): it is delivered.
		s.logger.Warn("cancel tombstone does not match the message at its sequence; delivering", slog.Uint64("seq", seq))
		return false
	}
	s.head.msg = nil
	s.pos.next = seq + 1
	s.view.passed.Store(seq)
	s.conf.win.passOver(seq)
	return true
}

// cancelHolds is the last look at the due head seq before it is handed
// off (delivered or forwarded): it reports true if the head must be looked
// at again instead. A cancel may have reserved it, or turned its
// reservation into a tombstone, since skipCancelled looked: a reserved
// head is held until the cancel's outcome is known (awaitCancel), a
// moving one until its move is placed or voided (awaitMove), a tombstoned
// or moved one is skipped at the next look.
func (s *owner) cancelHolds(ctx context.Context, seq uint64) bool {
	switch st, _, r := s.cancel.book.state(seq); st {
	case stateReserved:
		s.awaitCancel(ctx, r)
	case stateMoving:
		s.awaitMove(ctx, s.cancel.book.moving(seq))
	case stateFree:
		return false
	}
	return true
}

// awaitMove waits, on the scanner's goroutine, while the due head's move
// is in flight (its intent stored, its new message not known to be):
// until done is closed (placed: skipped; voided: delivered), a request
// wakes the loop, ctx is done, or moveLook passes (the head is looked at
// again: the term may have ended). Unlike a reservation it never expires:
// the old message may be passed only once its move is settled
// (docs/pending.md#25-safety-delivered-once-at-the-old-due-or-once-at-the-new-one).
func (s *owner) awaitMove(ctx context.Context, done <-chan struct{}) {
	t := time.NewTimer(moveLook)
	defer t.Stop()
	select {
	case <-done:
	case <-s.wake:
	case <-ctx.Done():
	case <-t.C:
	}
}

// moveLook is how long a moving head is waited for before it is looked at
// again.
const moveLook = time.Second

// loadTombstones reads the level's tombstones at the load (in a term: after
// the offset key's bump). Those the offset has passed go to the janitor;
// the rest are skipped when reached. The reads are direct gets, which a
// follower of an R3 stream may answer before it applied the latest
// writes: the walk is checked against the last tombstone the stream's
// leader has, and read again until it reached it, so a tombstone stored
// before the bump (a cancel answered "cancelled" by the previous owner)
// is never missed.
func (s *owner) loadTombstones(ctx context.Context, offset uint64) error {
	s.cancel.book.reset()
	subject := index.TombstoneSubject(s.cfg.Stream)
	retry := backoff.New(10*time.Millisecond, 200*time.Millisecond)
	var marks []index.PlacedMark
	for {
		var seen uint64
		marks = marks[:0]
		err := s.io.reader.EachOnSubject(ctx, index.CancelStream, subject, s.cfg.Batch, jswire.OpTimeout, func(m *nats.Msg, at uint64) {
			seen = max(seen, at)
			if p, ok := index.DecodePlacedMark(m, at); ok {
				marks = append(marks, p) // applied once every intent is loaded
				return
			}
			t, ok := index.DecodeTombstoneMsg(m, at)
			if !ok {
				// Not one delayd wrote: it cancels nothing and stays until an
				// operator removes it (docs/operations.md#state-in-nats-missing-garbled-from-another-table).
				s.logger.Warn("cancel tombstone not readable; ignored", slog.String("tombstones", index.CancelStream),
					slog.Uint64("tombstone_seq", at), slog.String("value", clip(m.Data, 64)))
				return
			}
			s.cancel.book.load(t) // indexed unknown: the janitor checks
		})
		if err != nil {
			return fmt.Errorf("cancel tombstones: %w", err)
		}
		lctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		_, last, found, err := jswire.LastOnSubject(lctx, s.deps.nc, index.CancelStream, subject)
		cancel()
		if err != nil {
			return fmt.Errorf("cancel tombstones: %w", err)
		}
		if !found || last <= seen {
			break
		}
		s.logger.Debug("cancel tombstones read from a replica behind the leader; reading again", slog.Uint64("seen", seen), slog.Uint64("leader_last", last))
		if !retry.Sleep(ctx) {
			return fmt.Errorf("cancel tombstones: %w", ctx.Err())
		}
	}
	s.loadMarks(marks)
	s.dropTombstones(offset)
	s.handMoves(offset)
	return nil
}

// handMoves hands the mover every loaded intent above offset whose new
// message is not known to be stored (moving): until it settles them,
// their heads are held.
func (s *owner) handMoves(offset uint64) {
	var jobs []moveJob
	for _, t := range s.cancel.book.movingAbove(offset) {
		jobs = append(jobs, moveJob{t: t, loadTail: s.life.loadTail, loadedAt: s.life.loadedAt, term: s.term})
	}
	if s.io.mover != nil {
		s.io.mover.add(jobs...)
	}
}

// loadMarks applies the placed marks read at the load, once every
// tombstone is loaded (a mark names its intent by the intent's sequence
// in index.CancelStream, wherever it stands): each intent it names is
// moved. A mark whose intent is not in the book (deleted, or a newer
// tombstone of its sequence kept instead) is handed to the retirer.
func (s *owner) loadMarks(marks []index.PlacedMark) {
	for _, p := range marks {
		if seq, ok := s.cancel.book.intentOf(p.Intent); ok && s.cancel.book.placed(seq, p.Intent, p.At) {
			continue
		}
		select {
		case s.cancel.retire <- retiree{move: true, markAt: p.At, from: s.io.tombstones}:
		default: // the retirer is behind: the next load offers it again
		}
	}
}

// dropTombstones hands the tombstones the acknowledged offset has passed
// to the retirer, which deletes them: from then on they cost nothing.
func (s *owner) dropTombstones(acked uint64) {
	s.cancel.book.drop(acked, func(r retiree) bool {
		r.from = s.io.tombstones
		select {
		case s.cancel.retire <- r:
			return true
		default: // the retirer is behind: next time
			return false
		}
	})
}

// pendingAt reports whether the message rec places in this level has not
// been handed to its target and is not cancelled (a cancel in flight
// counts as pending, and so does a move, in flight or done); a cascading
// message forwarded to its next level counts as pending until its due
// time (a cancel of it on its next level writes a newer "cancelled"
// record). The router calls it to merge; the
// answer may be overtaken by the loop at once, which is the merge's
// semantics: the later message arrived while the first was pending. It
// reads the owner's published view only (any goroutine). An owner that no
// longer owns the level (its term ended, or it was fenced) answers "not
// pending", as no owner does: it may still be in the term slot, its view
// going stale, until its loop returns.
func (s *owner) pendingAt(rec index.Record) bool {
	switch st, _, _ := s.cancel.book.state(rec.Seq); {
	case !s.owns():
		return false
	case st == stateMoving || st == stateMoved:
		// Delivered once, at one of its two places: a message merged
		// into it now is delivered with it
		// (docs/pending.md#26-merge-keys-run-now-reschedule-then-cancel).
		return true
	case st == stateCancelled:
		return false
	case rec.Seq > s.view.passed.Load():
		return true
	default:
		// By the server's clock; erring towards "not pending", which costs
		// a merge, never a message merged into one already delivered.
		return rec.Hop && rec.Due.After(s.clock.srv.upper())
	}
}

// pending is pendingAt once the owner's load has loaded the offset and
// the tombstones: until then it waits for that, at most
// [DecidePendingWait], and answers "not pending" if the load has not
// finished by then, the term ends, or ctx is done.
func (s *owner) pending(ctx context.Context, rec index.Record) bool {
	ready := s.view.ready.wait()
	select {
	case <-ready:
		return s.pendingAt(rec)
	default:
	}
	t := time.NewTimer(cmp.Or(s.hooks.pendingWait, DecidePendingWait))
	defer t.Stop()
	select {
	case <-ready:
		return s.pendingAt(rec)
	case <-s.done:
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// pendingNow is pendingAt once the owner's load has loaded the offset and
// the tombstones, and "not pending" before, without waiting: the decide
// server's answer.
func (s *owner) pendingNow(rec index.Record) bool { return s.view.ready.done() && s.pendingAt(rec) }

// passedNow returns the highest sequence the owner handed off once its
// load has loaded the offset; 0 before, and 0 once it no longer owns the
// level (its term ended, or it was fenced), as no owner answers (any
// goroutine).
func (s *owner) passedNow() uint64 {
	if !s.view.ready.done() {
		return 0 // its term's load has not loaded the offset yet
	}
	if !s.owns() {
		return 0 // its term ended or it was fenced: no owner's answer
	}
	return s.view.passed.Load()
}
