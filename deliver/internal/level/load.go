package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/delayd/delayd/offsets"
)

// load.go: a term's start: the offset loaded (or corrected) and the position set.

// start loads the offset and checks it against the stream's state,
// correcting one that makes no sense.
func (s *Level) start(outer context.Context) error {
	s.run.decides.Store(false)
	// startTimeout, not opTimeout: a request sent to a leader that hangs
	// is answered by nobody, and the start tried again within seconds
	// reaches the new leader once JetStream has elected one.
	ctx, cancel := context.WithTimeout(outer, startTimeout)
	defer cancel()
	// An offset write of the previous start lands before the offset is
	// loaded (and corrected if it belongs to a deleted stream).
	if err := s.commits.Settle(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	stream, err := streamInfo(ctx, s.deps.js, s.cfg.Stream)
	if err != nil {
		return fmt.Errorf("level stream: %w", err)
	}
	if leaderless(stream.CachedInfo()) {
		// Its state may lag the stream's: an offset past a lagging last
		// sequence would be "corrected" backwards.
		return errLeaderless
	}
	s.life.stream, s.life.created = stream, stream.CachedInfo().Created
	s.head.msg = nil
	s.conf.win.reset()
	s.freshFrom(stream.CachedInfo())
	st := stream.CachedInfo().State
	first := st.FirstSeq // with no messages, FirstSeq is LastSeq+1
	if first == 0 {
		first = 1
	}
	off, rev, err := s.loadOffset(ctx)
	if errors.Is(err, offsets.ErrFenced) {
		// Another owner wrote the key between the read and the bump.
		s.fenced()
		return errNotOwner
	}
	// Every correction is logged with what was found and what it means
	// (docs/operations.md#offsets-that-make-no-sense): delivering from first again
	// repeats whatever of first..last was delivered but not yet purged.
	// Under a lease it is a compare-and-set at the revision just read.
	correct := func(seq uint64, reason string) error {
		if !s.cfg.Fenced {
			return s.cfg.Offsets.Correct(ctx, s.cfg.Stream, seq, reason)
		}
		var cerr error
		rev, cerr = s.cfg.Offsets.CorrectAt(ctx, s.cfg.Stream, seq, rev, reason)
		if errors.Is(cerr, offsets.ErrFenced) {
			s.fenced()
			return errNotOwner
		}
		return cerr
	}
	again := redeliveryNote(first, st.LastSeq)
	if err == nil && s.replaced {
		// The stored offset counts the deleted stream's sequences.
		reason := fmt.Sprintf("offset %d belongs to a level stream deleted while delayd ran; %s", off, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
		s.replaced = false
	}
	switch {
	case errors.Is(err, offsets.ErrDeleted):
		// Deleted or purged by hand: it was committed once.
		off = first - 1
		if err := correct(off, err.Error()+"; "+again); err != nil {
			return err
		}
	case errors.Is(err, offsets.ErrNotFound) && first > 1:
		// No key and no trace of one, but only a scanner (after a commit)
		// or an operator purges a level stream: it was scanned before, and
		// the bucket lost the key (its stream purged, or the bucket
		// deleted and recreated).
		off = first - 1
		reason := fmt.Sprintf("no offset stored, but the stream was purged up to sequence %d, so it was delivered from before; %s", first-1, again)
		if err := correct(off, reason); err != nil {
			return err
		}
	case errors.Is(err, offsets.ErrNotFound):
		// A new level stream: never purged, so nothing was delivered from
		// it that a stored offset or its delete marker would not show.
		off = first - 1
		s.logger.Debug("new level stream: no offset yet", slog.Uint64("messages", st.Msgs))
	case errors.Is(err, offsets.ErrCorrupt):
		off = first - 1
		if err := correct(off, err.Error()+"; "+again); err != nil {
			return err
		}
	case err != nil:
		return err
	case off > st.LastSeq:
		// The stream was recreated, or the offset was set by hand past its end.
		reason := fmt.Sprintf("offset %d beyond the stream's last sequence %d; %s", off, st.LastSeq, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
	case off+1 < first:
		// Messages up to first-1 were purged, so they were delivered.
		reason := fmt.Sprintf("offset %d below the stream's first sequence %d: sequences up to %d were purged, so delivered; %s", off, first, first-1, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
	}
	s.run.passed.Store(off)
	s.life.startTail, s.life.startedAt = st.LastSeq, s.clock.srv.now()
	s.pos.offset, s.pos.purgedTo = off, first
	s.commits.ResetAt(off, rev)
	s.pos.tombsAcked = off // loadTombstones drops those up to off
	s.pos.next = off + 1
	s.head.resetFeed = true
	s.Written(st.LastSeq)
	s.grace.started(s.deps.nc.Stats().Reconnects)
	s.conf.coreUnflushed = false
	s.progress()
	s.logger.Debug("scanner started", slog.Uint64("offset", off), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("pending", st.LastSeq-off))
	if s.io.tombstones, err = streamInfo(ctx, s.deps.js, cancelStream); err != nil {
		return fmt.Errorf("cancel tombstones: %w", err)
	}
	// Not within start's timeout: a level may hold many cancelled messages.
	if err := s.loadTombstones(outer, off); err != nil {
		return err
	}
	s.run.decides.Store(true)
	return nil
}

// loadOffset loads the level's committed offset and, as its owner under a
// lease, bumps the offset key first (offsets.Store.Bump): a previous
// owner's next commit then fails its compare-and-set. revision is the
// key's revision to commit at (0 if unknown or never written). Errors as
// offsets.Store.Load; a write between the read and the bump wraps
// offsets.ErrFenced. It refuses to write for a term no longer valid.
func (s *Level) loadOffset(ctx context.Context) (offset, revision uint64, err error) {
	if !s.cfg.Fenced {
		offset, err = s.cfg.Offsets.Load(ctx, s.cfg.Stream)
		return offset, 0, err
	}
	if !s.owns() {
		return 0, 0, errNotOwner
	}
	return s.cfg.Offsets.Bump(ctx, s.cfg.Stream)
}

// redeliveryNote says what a correction to first-1 means for a level stream
// holding sequences first..last: each of them that was delivered already
// (the kept last delivered message, and what a crash left unpurged) is
// delivered again.
func redeliveryNote(first, last uint64) string {
	if last < first {
		return "the stream holds no messages: nothing is delivered again"
	}
	return fmt.Sprintf("delivering from sequence %d: messages %d..%d that were delivered already are delivered again", first, first, last)
}
