package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/offsets"
)

// load.go: a term's load: the offset loaded (or corrected) and the position set.

// load loads the offset and checks it against the stream's state,
// correcting one that makes no sense. It sets the owner's stream life and
// position as fresh values (a reload replaces them whole) and, once the
// tombstones are loaded too, its readiness: until then other goroutines
// wait for it, or answer without it.
func (s *owner) load(outer context.Context) error {
	s.view.ready.reset()
	// loadTimeout, not jswire.OpTimeout: a request sent to a leader that hangs
	// is answered by nobody, and the load tried again within seconds
	// reaches the new leader once JetStream has elected one.
	ctx, cancel := context.WithTimeout(outer, loadTimeout)
	defer cancel()
	// An offset write of the previous load lands before the offset is
	// loaded (and corrected if it belongs to a deleted stream).
	if err := s.commits.Await(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	stream, err := jswire.StreamInfo(ctx, s.deps.js, s.cfg.Stream)
	if err != nil {
		return fmt.Errorf("level stream: %w", err)
	}
	if leaderless(stream.CachedInfo()) {
		// Its state may lag the stream's: an offset past a lagging last
		// sequence would be "corrected" backwards.
		return errLeaderless
	}
	s.life = streamLife{stream: stream, created: stream.CachedInfo().Created}
	s.head.msg = nil
	s.conf.win.reset()
	s.freshFrom(stream.CachedInfo())
	st := stream.CachedInfo().State
	first := firstSeq(st)
	off, rev, err := s.loadOffset(ctx)
	if errors.Is(err, offsets.ErrFenced) {
		// Another owner wrote the key between the read and the bump.
		s.fence()
		return ownership.ErrNotOwner
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
			s.fence()
			return ownership.ErrNotOwner
		}
		return cerr
	}
	if err != nil && !errors.Is(err, offsets.ErrDeleted) && !errors.Is(err, offsets.ErrNotFound) && !errors.Is(err, offsets.ErrCorrupt) {
		return err
	}
	found := offsetState{off: off, err: err}
	if s.replaced && err == nil {
		// The stored offset counts the deleted stream's sequences.
		fixed, reason, _ := correction(found, st, true)
		if err := correct(fixed, reason); err != nil {
			return err
		}
		s.replaced = false
		// Then checked against the stream as a stored offset is.
		found.off = fixed
	}
	off, reason, write := correction(found, st, false)
	switch {
	case write:
		if err := correct(off, reason); err != nil {
			return err
		}
	case reason != "":
		s.logger.Debug(reason, slog.Uint64("messages", st.Msgs))
	}
	s.view.passed.Store(off)
	s.life.loadTail, s.life.loadedAt = st.LastSeq, s.clock.srv.now()
	// tombsAcked: loadTombstones drops those up to off.
	s.pos = position{offset: off, next: off + 1, purgedTo: first, lastPurge: s.pos.lastPurge, tombsAcked: off, reload: s.pos.reload}
	s.commits.ResetAt(off, rev)
	s.head.resetFeed = true
	s.Written(st.LastSeq)
	s.grace.started(s.deps.nc.Stats().Reconnects)
	s.conf.coreUnflushed = false
	s.progress()
	s.logger.Debug("scanner started", slog.Uint64("offset", off), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("pending", st.LastSeq-off))
	if s.io.tombstones, err = jswire.StreamInfo(ctx, s.deps.js, index.CancelStream); err != nil {
		return fmt.Errorf("cancel tombstones: %w", err)
	}
	// Not within load's timeout: a level may hold many cancelled messages.
	if err := s.loadTombstones(outer, off); err != nil {
		return err
	}
	s.view.ready.set()
	return nil
}

// offsetState is what a load found under the level's offset key: the
// stored offset, or why there is none. err is nil or (wrapping)
// offsets.ErrDeleted, ErrNotFound or ErrCorrupt; any other error of
// loadOffset stops the load before a correction is looked for.
type offsetState struct {
	off uint64 // the stored offset, when err is nil
	err error
}

// correction is the offset a load starts from, given what it found under
// the offset key, the level stream's state, and whether the stream was
// found recreated (replaced) while the previous term ran. off is the
// offset to start from; write says it corrects the stored one: it is
// written with reason, logged with what was found and what it means
// (docs/operations.md#offsets-that-make-no-sense). Without write, a
// non-empty reason is a debug note (a new level stream). It is pure: the
// load does the writes.
//
// Every correction is to first-1 (first: the stream's first sequence), so
// delivering from first again repeats whatever of first..last was delivered
// but not yet purged (redeliveryNote).
//
// Otherwise the stored offset stands (write false, reason empty).
func correction(found offsetState, st jetstream.StreamState, replaced bool) (off uint64, reason string, write bool) {
	first := firstSeq(st)
	again := redeliveryNote(first, st.LastSeq)
	off = found.off
	switch err := found.err; {
	case err == nil && replaced:
		// The stored offset counts the deleted stream's sequences.
		return first - 1, fmt.Sprintf("offset %d belongs to a level stream deleted while delayd ran; %s", off, again), true
	case errors.Is(err, offsets.ErrDeleted):
		// Deleted or purged by hand: it was committed once.
		return first - 1, err.Error() + "; " + again, true
	case errors.Is(err, offsets.ErrNotFound) && first > 1:
		// No key and no trace of one, but only a scanner (after a commit)
		// or an operator purges a level stream: it was scanned before, and
		// the bucket lost the key (its stream purged, or the bucket
		// deleted and recreated).
		return first - 1, fmt.Sprintf("no offset stored, but the stream was purged up to sequence %d, so it was delivered from before; %s", first-1, again), true
	case errors.Is(err, offsets.ErrNotFound):
		// A new level stream: never purged, so nothing was delivered from
		// it that a stored offset or its delete marker would not show.
		return first - 1, "new level stream: no offset yet", false
	case errors.Is(err, offsets.ErrCorrupt):
		return first - 1, err.Error() + "; " + again, true
	case off > st.LastSeq:
		// The stream was recreated, or the offset was set by hand past its end.
		return first - 1, fmt.Sprintf("offset %d beyond the stream's last sequence %d; %s", off, st.LastSeq, again), true
	case off+1 < first:
		// Messages up to first-1 were purged, so they were delivered.
		return first - 1, fmt.Sprintf("offset %d below the stream's first sequence %d: sequences up to %d were purged, so delivered; %s", off, first, first-1, again), true
	}
	return off, "", false
}

// firstSeq is the level stream's first sequence as a load counts it: with
// no messages, FirstSeq is LastSeq+1, and a stream never written has 0,
// counted as 1.
func firstSeq(st jetstream.StreamState) uint64 {
	if st.FirstSeq == 0 {
		return 1
	}
	return st.FirstSeq
}

// loadOffset loads the level's committed offset and, as its owner under a
// lease, bumps the offset key first (offsets.Store.Bump): a previous
// owner's next commit then fails its compare-and-set. revision is the
// key's revision to commit at (0 if unknown or never written). Errors as
// offsets.Store.Load; a write between the read and the bump wraps
// offsets.ErrFenced. It refuses to write for a term no longer valid.
func (s *owner) loadOffset(ctx context.Context) (offset, revision uint64, err error) {
	if !s.cfg.Fenced {
		offset, err = s.cfg.Offsets.Load(ctx, s.cfg.Stream)
		return offset, 0, err
	}
	if !s.owns() {
		return 0, 0, ownership.ErrNotOwner
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

// startRetry is the owner's wait before it tries a failed load or step
// again: a capped, jittered backoff from 100 ms to 5 s, but at most
// hedge.AfterLeader while the failure is a request nobody answered
// (unanswered): a leader that hangs is replaced by an election of a few
// seconds, and the first try after it is then at most a second late
// instead of up to the backoff's cap.
type startRetry struct{ slow, quick *backoff.Backoff }

func newStartRetry() startRetry {
	return startRetry{slow: backoff.New(100*time.Millisecond, 5*time.Second), quick: backoff.New(100*time.Millisecond, hedge.AfterLeader)}
}

// next is the wait after a failure with err.
func (r startRetry) next(err error) time.Duration {
	if unanswered(err) {
		return r.quick.Next()
	}
	return r.slow.Next()
}

// sleep waits next(err), or until ctx is done (false).
func (r startRetry) sleep(ctx context.Context, err error) bool {
	return sleepCtx(ctx, r.next(err)) == nil
}

// reset starts both backoffs over, after a success.
func (r startRetry) reset() {
	r.slow.Reset()
	r.quick.Reset()
}

// unanswered reports whether err is a request's timeout or no responders,
// an answer from a stream with no leader, or a consumer's server gone
// silent: what a hung server or an election in progress looks like.
func unanswered(err error) bool {
	return hedge.IsTimeout(err) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, errLeaderless) || errors.Is(err, jswire.ErrNoHeartbeat)
}
