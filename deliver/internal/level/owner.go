package level

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/hedge"
)

// owner.go: the level's loop for a lease term (Run), its ownership check and its shutdown.

// owns reports whether the scanner may hand off (publish, forward,
// dead-letter) now: its lease term is valid (an exact check on the
// monotonic clock: a mutex and a clock read per hand-off) and no offset
// commit was fenced. A hand-off after the fence can only come from a pause
// between this check and the publish, one per level;
// docs/guarantees.md#a-restart-after-a-crash states that bounded
// duplicate window. The offset cannot go wrong even then: every commit is
// a compare-and-set. Safe from any goroutine: the answers to askers
// (pendingAt, passedNow) make the same check, so that an owner whose term
// ended or that was fenced, still in the term slot until its loop returns,
// answers as no owner does.
func (s *owner) owns() bool { return !s.fenced.Load() && s.term.Held() }

// owner owns the level for one lease term (docs/reshape.md 2.1): what is
// fresh each term. [Level.RunTerm] builds it when the term begins and drops
// it when the term ends; [Level.Run] builds one for a level on its own
// (the zero Term, always held). It embeds the *Level it runs, for what
// outlives a term. Every field is written only by its loop (the goroutine
// running RunTerm or Run) unless its comment says otherwise.
type owner struct {
	*Level
	term   ownership.Term // the lease term it runs in; the zero Term, always held, for a level on its own
	io     ioSet          // reader, PubAcks, feed (opened by run), tombstones, idMAC
	life   streamLife     // the stream the position belongs to, as load found it
	pos    position       // offset, next, purges, reload
	head   headState      // the head message and the feed's state
	conf   confirmation   // window, core flushes, backoff
	fenced atomic.Bool    // an offset commit failed its compare-and-set: the level stops (read by askers too, through owns)
	asks   chan request   // cancel and status requests, sent by any goroutine, decided on the loop (no I/O there)
	wake   chan struct{}  // wakes the loop from a wait to decide them (capacity 1; any goroutine sends)
	done   chan struct{}  // closed when run has returned; askers stop waiting on it
	view   published      // read by any goroutine without the loop's turn: passed, ready
}

// newOwner returns a fresh owner of l for the term t: its groups empty, its
// channels new.
func newOwner(l *Level, t ownership.Term) *owner {
	return &owner{
		Level: l,
		term:  t,
		conf: confirmation{
			win:     newWindow(l.cfg.Window),
			backoff: backoff.New(100*time.Millisecond, 5*time.Second),
		},
		asks: make(chan request, 64),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
}

// Run delivers until ctx is done, as a level on its own (unfenced, the
// zero Term, in no term slot). On the way out it confirms what is in
// flight, commits the offset and returns nil. It survives server restarts,
// retrying with capped, jittered backoff.
func (s *Level) Run(ctx context.Context) error { return newOwner(s, ownership.Term{}).run(ctx) }

// run delivers until ctx is done or the term is found no longer valid, and
// closes s.done as it returns. On the way out it confirms what is in
// flight and commits the offset. It starts the term's retirer and stops it
// before it returns.
func (s *owner) run(ctx context.Context) error {
	defer close(s.done)
	reader, err := jswire.NewBatchReader(s.deps.nc, s.cfg.Batch)
	if err != nil {
		return err
	}
	if s.hooks.loseReads != nil {
		reader.LoseReplies(s.hooks.loseReads)
	}
	s.io.reader = reader
	defer reader.Close()
	acks, err := jswire.NewPubAcks(s.deps.nc, s.hooks.ackTimeout)
	if err != nil {
		return err
	}
	acks.FailOnDisconnect()
	if s.hooks.loseAcks != nil {
		acks.LoseReplies(s.hooks.loseAcks)
	}
	s.io.acks = acks
	defer acks.Close() // after shutdown has confirmed what is in flight
	s.io.feed = newFeed(s.deps.nc, s.deps.js, s.cfg.Stream, s.cfg.Batch, s.cfg.BatchBytes)
	defer s.io.feed.close()
	retire := startRetirer(ctx, s.Level)
	defer retire.Stop()
	s.io.mover = startMover(ctx, s.Level)
	defer s.io.mover.Stop()
	defer s.shutdown()

	retry := newStartRetry()
	s.pos.reload = true
	for {
		if s.pos.reload {
			// At the term's load, and whenever the level stream is not the one the
			// offset belongs to (deleted, or deleted and recreated).
			if err := s.load(ctx); err != nil {
				if ctx.Err() != nil || errors.Is(err, ownership.ErrNotOwner) {
					return nil
				}
				s.term.Recovering(true)
				s.logger.Warn("scanner start failed; retrying", slog.Any("error", err))
				if !retry.sleep(ctx, err) {
					return nil
				}
				continue
			}
			s.pos.reload = false
			s.term.Recovering(false) // loaded (a step may wait long for a due head)
			retry.reset()
		}
		s.stats.steps.Add(1)
		err := s.step(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ownership.ErrNotOwner) || s.fenced.Load() {
			return nil // logged where it was found
		}
		if err != nil {
			s.logger.Warn("scanner step failed; retrying", slog.Any("error", err))
			if !retry.sleep(ctx, err) {
				return nil
			}
			continue
		}
		retry.reset()
	}
}

// sleep waits d, or until ctx is done or a cancel request wakes the scanner.
func (s *owner) sleep(ctx context.Context, d time.Duration) error {
	return sleepWake(ctx, s.wake, d)
}

// sameStream reports whether the level stream is still the one the scanner
// loaded. If it was deleted, or deleted and recreated, the scanner
// reloads (offset checked against the new stream) and it returns false.
func (s *owner) sameStream(ctx context.Context) bool {
	// Only the stream's leader answers, and the scanner waits (before a
	// purge): sent again every hedge.AfterLeader while unanswered.
	ictx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	info, err := hedge.Do(ictx, hedge.AfterLeader, func(ctx context.Context) (*jetstream.StreamInfo, error) {
		if s.hooks.losePurge != nil && s.hooks.losePurge(ctx, "info") {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return s.life.stream.Info(ctx)
	})
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s.logger.Warn("level stream gone; starting over")
	case err != nil || leaderless(info):
		return true // unknown: the caller's own request will fail or succeed
	case !info.Created.Equal(s.life.created) || s.commits.Committed() > info.State.LastSeq:
		s.logger.Warn("level stream recreated; starting over")
	default:
		return true
	}
	s.pos.reload, s.head.resetFeed, s.replaced = true, true, true
	return false
}

// shutdown confirms and commits what is in flight when Run ends. Run's
// context is done by then, so it works on fresh contexts, each bounded by
// jswire.OpTimeout: one to confirm the deliveries and purge, one to wait for the
// offset write.
func (s *owner) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), jswire.OpTimeout)
	defer cancel()
	// A term whose load never set a position has nothing of its own to
	// confirm, drop or purge: what the level's previous owner delivered,
	// it confirmed and purged at its own shutdown.
	loaded := s.pos.next != 0
	if loaded {
		s.confirmAll(ctx)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), jswire.OpTimeout)
	if err := s.commits.Await(cctx); err != nil && cctx.Err() != nil {
		s.logger.Warn("offset commit unconfirmed at shutdown", slog.Uint64("offset", s.commits.Committed()))
	}
	ccancel()
	if s.commits.Fenced() {
		s.fence() // a commit refused after the term ended, or before a Commit saw it
	}
	if loaded {
		s.noteAcked()
		s.purge(ctx, true) // the delivered prefix goes with a clean stop
	}
	s.logger.Debug("scanner stopped", slog.Uint64("offset", s.commits.Committed()))
}

// leaderless reports whether a stream info was answered by a member of a
// replicated stream's group while the group had no leader. nats-server lets
// such a follower answer with its own state, which may lag the stream's:
// a lower last sequence (an offset past it would look like a recreated
// stream) or an older first sequence. A scanner decides nothing from it.
// (A clustered leader's info names it in Cluster.Leader; a standalone
// server names itself.)
func leaderless(info *jetstream.StreamInfo) bool {
	return info != nil && info.Cluster != nil && info.Cluster.Leader == ""
}

func sleepCtx(ctx context.Context, d time.Duration) error { return sleepWake(ctx, nil, d) }

// sleepWake waits d, or until ctx is done (its error) or wake receives
// (nil; a nil wake never does).
func sleepWake(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-wake:
	}
	return nil
}
