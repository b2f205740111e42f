package level

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// step.go: one step of the loop: read the head, decide, hand off what is due.

// step delivers the head if it is due, or waits for it: it reads the head
// (readHead), looks at it (lookAtHead) and hands it off when due (handOff).
func (s *owner) step(ctx context.Context) error {
	s.serveCancels()
	if s.head.resetFeed {
		if !s.sameStream(ctx) {
			return nil
		}
		if err := s.io.feed.reset(ctx, s.pos.next); err != nil {
			return err
		}
		s.head.resetFeed, s.head.msg, s.head.fresh = false, nil, true
	}
	if s.head.msg == nil {
		if err := s.readHead(ctx); err != nil || s.head.msg == nil {
			return err
		}
	}
	m, seq := s.head.msg, s.head.meta.StreamSeq
	if s.conf.win.skipDone(seq) {
		// Confirmed before an earlier delivery failed: not sent again.
		s.head.msg = nil
		s.pos.next = seq + 1
		return nil
	}
	if message.IsMarker(m.Subject) {
		// A router's epoch marker (deliver/internal/routing/marker.go): never delivered nor
		// counted; the offset passes it in order, like a cancelled one.
		s.head.msg = nil
		s.pos.next = seq + 1
		s.view.passed.Store(seq)
		s.conf.win.passOver(seq)
		s.afterPublish(ctx)
		return nil
	}
	if s.skipCancelled(m, seq) {
		s.afterPublish(ctx)
		return nil
	}
	target, v, a := s.lookAtHead(ctx, m)
	if !a.handOff() {
		if !a.idle() {
			s.headFellDue(a.fellDue) // held: a due head, and no progress
		}
		if !s.quiesce(ctx, a.idle()) {
			return nil // a delivery failed and was rewound: read it again
		}
		return s.sleep(ctx, a.wait)
	}
	return s.handOff(ctx, m, seq, target, v, a)
}

// readHead reads the next message of the level stream into the head. With
// nothing buffered it first confirms and commits what is in flight, purges
// when the level has been quiet a moment, then waits for a message or a
// wake. It leaves the head empty, with a nil error, when the step is to
// start again: a delivery failed and was rewound, a cancel request woke it,
// ctx ended, the read went back after a reset, or it skipped a sequence.
func (s *owner) readHead(ctx context.Context) error {
	m, meta, err := s.io.feed.next(ctx, nil, false, 0)
	if err == nil && m == nil {
		// Nothing buffered: confirm and commit before blocking. A
		// failed delivery that was rewound is still the due head.
		if !s.quiesce(ctx, !s.conf.win.probing) {
			return nil // a delivery failed and was rewound
		}
		if c := s.commits.Committed(); c > s.pos.purgedTo || c > s.pos.tombsAcked {
			// A purge is due once the level has been quiet a moment,
			// and so is the drop of the tombstones the commit passed
			// (awaitCommit's noteAcked): the purged prefix may reach the
			// committed offset already (a new stream's first sequence,
			// or a purge that read the acknowledgement first), and no
			// later commit may come to drop them.
			if m, meta, err = s.io.feed.next(ctx, s.wake, true, s.cfg.PurgeEvery); err == nil && m == nil {
				s.awaitCommit(ctx) // acknowledged by now, normally: the purge goes up to it
				s.purge(ctx, true)
			}
		}
		if err == nil && m == nil {
			m, meta, err = s.io.feed.next(ctx, s.wake, true, 0)
		}
	}
	if errors.Is(err, jswire.ErrWoken) {
		return nil // a cancel request: decided at the top of the next step
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.confirmAll(ctx)
		s.head.resetFeed = true
		return err
	}
	if meta.StreamSeq < s.pos.next {
		return nil // read again after a reset
	}
	fresh := s.head.fresh
	s.head.fresh = false
	if meta.StreamSeq > s.pos.next && !fresh {
		// A level stream has no gaps above its purged prefix, so a
		// sequence skipped mid-stream was lost on the way (a full
		// client buffer): read again from next.
		s.logger.Warn("level stream read skipped a sequence; reading again", slog.Uint64("want", s.pos.next), slog.Uint64("got", meta.StreamSeq))
		s.head.resetFeed = true
		return nil
	}
	s.head.msg, s.head.meta = m, meta
	s.observeClock(ctx, meta.StreamSeq, meta.Stored)
	return nil
}

// lookAtHead builds the view of the head m, asking only what decide reads
// (see headView): its target and due time, the server's clock (refreshed
// when stale, or when the head is due but for the drift allowed), whether it
// hops or is bound to a stream, the connection and the start grace. It
// returns the target, the view and what decide makes of it.
func (s *owner) lookAtHead(ctx context.Context, m *nats.Msg) (string, headView, headAction) {
	target, due := s.parse(m, s.head.meta.Stored)
	v := headView{due: due}
	if s.clock.srv.stale() {
		s.refreshClock(ctx)
	}
	v.now = s.clock.srv.now()
	v.hopDue, v.hop = s.hopDue(m)
	if when := v.waitsFor(); when.After(v.now) && s.clock.srv.uncertain(when) {
		// Due but for the drift allowed since an older observation.
		s.refreshClock(ctx)
		v.now = s.clock.srv.now()
	}
	if !v.hop {
		v.bound = s.cfg.Targets.Bound(target)
	}
	if v.coreDue() {
		if v.disconnected = !s.deps.nc.IsConnected(); v.disconnected {
			s.grace.disconnected() // the next look starts the grace
		} else {
			// A reconnect this scanner saw happen, or one that happened
			// while it slept (the reconnect count, looked at no more than
			// every 50 ms), starts the grace for what fell due meanwhile.
			s.grace.look(func() uint64 { return s.deps.nc.Stats().Reconnects })
		}
	}
	if !v.hop && !v.bound && !v.disconnected {
		v.grace = s.grace.hold(v.due, v.now)
	}
	return target, v, v.decide()
}

// handOff hands off the due head m (seq) as a decided: a delivery to its
// target or, for a hop, a forward to ingress. It holds the head instead
// while a cancel of it is in flight, while an older partition's messages
// wait (the order gate), and stops the level when the lease term has ended.
func (s *owner) handOff(ctx context.Context, m *nats.Msg, seq uint64, target string, v headView, a headAction) error {
	// A due head: a hand-off (moving on, for a hop) that keeps failing
	// stalls the level.
	s.headFellDue(a.fellDue)
	if s.cancelHolds(ctx, seq) {
		return nil // looked at again: skipped if cancelled
	}
	if held, err := s.cfg.Gate.holds(ctx, seq); held != "" {
		// Routed under the level's current partition count while an older
		// message of the level waits in another stream: it goes first.
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("partition order check failed; holding the head", slog.Any("error", err))
		}
		if held != s.head.gateHeld {
			s.head.gateHeld = held
			s.logger.Info("holding the level's new messages until an older partition's are delivered", slog.String("older", held), slog.Uint64("seq", seq))
		}
		if !s.quiesce(ctx, false) {
			return nil
		}
		return s.sleep(ctx, orderGatePoll)
	}
	if !s.owns() {
		// Checked once per hand-off, after any wait: the head stays
		// unpassed for the next owner.
		s.logger.Info("level stopped: this replica's lease term ended", slog.Uint64("epoch", s.term.Epoch), slog.Uint64("seq", seq))
		return ownership.ErrNotOwner
	}
	s.head.msg = nil
	s.pos.next = seq + 1
	s.view.passed.Store(seq)
	if a.kind == headForward {
		if err := s.forward(ctx, m, seq, target, v.due); err != nil {
			return err
		}
	} else {
		s.stats.lastLateness.Store(int64(a.lateness))
		if s.cfg.OnDelivery != nil {
			s.cfg.OnDelivery(a.lateness)
		}
		if err := s.publish(ctx, m, seq, target, v.bound); err != nil {
			return err
		}
	}
	s.afterPublish(ctx)
	return nil
}

// afterPublish confirms deliveries as the window requires.
func (s *owner) afterPublish(ctx context.Context) {
	switch {
	case s.conf.win.probing:
		s.confirmAll(ctx)
	case s.conf.win.full():
		s.confirmOldest(ctx, s.cfg.Window/2)
		s.purge(ctx, false)
	}
}

// hopDue returns when a cascading message's wait at this level ends, if it
// has more to wait after it.
func (s *owner) hopDue(m *nats.Msg) (time.Time, bool) {
	v := m.Header.Get(message.HdrHopDue)
	if v == "" {
		return time.Time{}, false
	}
	t, err := message.ParseTime(v)
	return t, err == nil
}

// quiesce readies the scanner to wait: it confirms and commits what is in
// flight and purges the delivered prefix. With idle set (the head is not due,
// or there is none) it marks the level as holding no due head. It returns
// false if a delivery failed and was rewound, in which case the caller must
// read again instead of waiting.
func (s *owner) quiesce(ctx context.Context, idle bool) bool {
	next := s.pos.next
	s.confirmAll(ctx)
	if s.pos.next != next {
		return false
	}
	s.purge(ctx, false)
	if idle {
		s.noDueHead()
	}
	return true
}

// parse returns a level message's target and due time. A message without a
// readable Delay-Due-At (written by hand) is due at its level-stream store
// time plus the stream's delay, never earlier than the contract's due.
func (s *owner) parse(m *nats.Msg, stored time.Time) (string, time.Time) {
	target := strings.TrimPrefix(m.Subject, s.cfg.subject)
	due, err := message.ParseTime(m.Header.Get(contract.HeaderDueAt))
	if err != nil {
		due = stored.Add(s.cfg.delay)
		s.logger.Warn("level message without a valid due time; using its store time plus the level's delay", slog.String("value", m.Header.Get(contract.HeaderDueAt)))
	}
	return target, due
}
