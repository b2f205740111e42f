package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/offsets"
)

// confirm.go: the confirmation of hand-offs (the window), retries of failed
// ones, the offset commit and the purge of the delivered prefix.

// confirmAll confirms every in-flight delivery in order and commits the offset
// up to the first failure. After a failure the scanner rewinds to the failed
// delivery and probes: it sends one delivery at a time, with capped backoff,
// until the target takes it. Deliveries after the failed one that were
// confirmed anyway are remembered and not sent again, so a failing target
// costs no flood of re-deliveries.
func (s *owner) confirmAll(ctx context.Context) { s.confirmOldest(ctx, len(s.conf.win.inflight)) }

// confirmOldest confirms the oldest n in-flight deliveries and commits the
// offset past them, leaving the rest in flight so the pipeline to the
// target never drains while the window is full. A failure among them
// confirms everything, as confirmAll does.
func (s *owner) confirmOldest(ctx context.Context, n int) {
	if len(s.conf.win.inflight) == 0 {
		s.commit(ctx)
		return
	}
	if n < len(s.conf.win.inflight) && s.conf.win.firstFailure(n) {
		n = len(s.conf.win.inflight)
	}
	// Deliveries already sent are confirmed even when ctx ends (a stop):
	// on a fresh context bounded by jswire.OpTimeout, keeping ctx's values.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
	defer cancel()
	var (
		core      coreFlush
		failed    delivery
		failedErr error
	)
	for i := 0; i < n; i++ {
		d := s.conf.win.inflight[i]
		err := s.outcomeOf(cctx, d, &core)
		switch s.conf.win.record(d, err, failedErr != nil) {
		case outFailed:
			failed, failedErr = d, err
			// Everything behind it is confirmed too, so that the rewind
			// leaves nothing in flight and successes are remembered.
			n = len(s.conf.win.inflight)
		case outPassed:
			s.pos.offset = d.seq
			s.stats.headDue.Store(0)
			s.progress()
			if !d.confirmed && !d.hop {
				s.stats.delivered.Add(1)
			}
		case outRemembered:
			if !d.hop {
				s.stats.delivered.Add(1)
			}
		}
	}
	s.conf.win.drop(n)
	s.commit(ctx)
	if failedErr == nil {
		s.conf.win.probing = false
		return
	}
	s.failed(ctx, failed, failedErr)
}

// outcomeOf waits for the outcome of the in-flight delivery d: nil if its
// target took it (or it was confirmed already), else why not. A core
// publish is confirmed by the pass's one flush, a JetStream publish by its
// PubAck; a refusal for permission is message.ErrPermissionDenied, and a publish
// nobody answered whose subject no stream captures any more (by the
// refreshed index) was delivered to no one: nil.
func (s *owner) outcomeOf(ctx context.Context, d delivery, core *coreFlush) error {
	var err error
	switch {
	case d.confirmed:
	case d.fut == nil:
		err = core.flush(ctx, s)
		if err == nil && s.cfg.Targets.Refused(d.target) {
			err = fmt.Errorf("%w: publish to %q", message.ErrPermissionDenied, d.target)
		}
	default:
		<-d.fut.Done() // a PubAck, an error, or the tracker's timeout
		_, err = d.fut.Result()
		if err != nil && s.cfg.Targets.Refused(d.target) {
			err = fmt.Errorf("%w: publish to %q: %v", message.ErrPermissionDenied, d.target, err)
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			// Nobody answered: the target's stream may be gone, or be
			// electing a leader. Only if the refreshed index says no
			// stream captures the subject is it a core subject without
			// interest, delivered to no one; otherwise it is retried.
			s.cfg.Targets.Forget(d.target)
			if rerr := s.cfg.Targets.Refresh(ctx); rerr == nil && !s.cfg.Targets.Bound(d.target) {
				err = nil
			}
		}
	}
	return err
}

// coreFlush is the one flush of a confirmation pass: it confirms every core
// publish sent before it, and is done the first time a core delivery needs
// confirming.
type coreFlush struct {
	flushed bool
	err     error
}

// flush flushes s's connection the first time it is called, and returns
// that flush's outcome every time.
func (f *coreFlush) flush(ctx context.Context, s *owner) error {
	if f.flushed {
		return f.err
	}
	f.flushed = true
	before := s.deps.nc.LastError()
	sent := s.deps.nc.Stats().Reconnects
	f.err = s.deps.nc.FlushWithContext(ctx)
	// A flush confirms what the server received on the connection
	// its PING went out on. Core publishes sent on an earlier
	// connection (since the last flush) may have been lost with
	// it, and a flush sent while reconnecting completes on the new
	// one: neither confirms them, so they are delivered again
	// (docs/guarantees.md#at-least-once: a core subscriber may see a window
	// again after a reconnect).
	done := s.deps.nc.Stats().Reconnects
	if f.err == nil && s.conf.coreUnflushed && (s.conf.coreReconnects != sent || done != sent) {
		f.err = errReconnected
	}
	s.conf.coreUnflushed = false
	// The server answers a refused publish with -ERR before the
	// flush's PONG, and the client records it as LastError.
	if e := s.deps.nc.LastError(); e != before {
		s.cfg.Targets.NoteError(e)
	}
	return f.err
}

// failed handles the first delivery of a window that was not confirmed: it
// is dead-lettered when its target refused it permanently and often enough,
// otherwise retried after a capped backoff.
func (s *owner) failed(ctx context.Context, d delivery, err error) {
	s.pos.next, s.head.msg, s.head.resetFeed = d.seq, nil, true
	n := s.conf.win.failedAgain(d.seq)
	s.stats.retries.Add(1)
	if permanent(err) && n >= s.cfg.MaxAttempts {
		// Its dead letter is written even when ctx ends (see deadLetterUndeliverable),
		// so it is read on a fresh context bounded by jswire.OpTimeout.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
		buf, rerr := s.io.reader.Read(rctx, s.cfg.Stream, nil, d.seq, 1, 1)
		cancel()
		if rerr == nil && len(buf) == 1 {
			if seq, _ := strconv.ParseUint(buf[0].Header.Get(message.HdrJSSequence), 10, 64); seq == d.seq {
				s.conf.win.forgetAttempts(d.seq)
				s.deadLetterUndeliverable(ctx, buf[0], d.seq, fmt.Errorf("target %q refused it %d times: %w", d.target, n, err))
				return
			}
		}
	}
	// The first attempt and every 10th at warn, the others at debug: a target
	// that refuses for minutes logs a line a minute, not one per retry.
	logLevel := slog.LevelWarn
	if n > 1 && n%10 != 0 {
		logLevel = slog.LevelDebug
	}
	s.logger.Log(ctx, logLevel, "delivery failed; retrying", slog.String("target", d.target), slog.Uint64("seq", d.seq), slog.Int("attempt", n), slog.Any("error", err))
	s.conf.backoff.SetCur(min(time.Duration(n)*100*time.Millisecond, 5*time.Second))
	s.conf.backoff.Sleep(ctx)
}

// permanent reports whether a target's refusal will not change on retry:
// too large for it, or not permitted.
func permanent(err error) bool {
	return message.TooLarge(err) || errors.Is(err, message.ErrPermissionDenied)
}

// commit hands the offset to the committer if it moved, without waiting:
// the write is pipelined behind the deliveries it confirms (one in flight,
// the latest offset next; see [offsets.Committer]).
func (s *owner) commit(ctx context.Context) {
	s.noteAcked()
	// Once a write failed its compare-and-set, every Commit returns the
	// fence (the next one after the failure at the latest).
	err := s.commits.Commit(ctx, s.pos.offset)
	switch {
	case errors.Is(err, offsets.ErrFenced):
		s.fence()
	case err != nil:
		s.logger.Warn("offset commit failed", slog.Uint64("offset", s.pos.offset), slog.Any("error", err))
	}
}

// fenced stops the level: an offset commit failed its compare-and-set, so
// another owner wrote the offset. Logged and counted once per term.
func (s *owner) fence() {
	if s.fenced.Load() {
		return
	}
	s.fenced.Store(true)
	s.stats.fencedWrites.Add(1)
	s.logger.Warn("level stopped: its offset was written by another owner (fenced)", slog.Uint64("epoch", s.term.Epoch), slog.Uint64("offset", s.pos.offset))
}

// awaitCommit waits, at most jswire.OpTimeout, until the committed offset is
// acknowledged (or its write failed; the committer logged it). The scanner
// calls it when idle, before a purge: the commit lag reads 0 while idle.
func (s *owner) awaitCommit(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	_ = s.commits.Await(cctx)
	cancel()
	s.noteAcked()
}

// noteAcked drops the tombstones of cancelled messages the acknowledged
// offset passed: they are no longer needed.
func (s *owner) noteAcked() {
	if a := s.commits.Stored(); a != s.pos.tombsAcked {
		s.pos.tombsAcked = a
		s.dropTombstones(a)
	}
}

// purge removes the delivered prefix up to the acknowledged offset,
// keeping the message at it: a purge never passes an offset the KV bucket
// has not stored.
func (s *owner) purge(ctx context.Context, idle bool) {
	mono := s.cfg.Clock.Mono()
	acked := s.commits.Stored()
	if ctx.Err() != nil || acked <= s.pos.purgedTo || (!idle && mono-s.pos.lastPurge < s.cfg.PurgeEvery) {
		return
	}
	s.pos.lastPurge = mono // a failing purge is not retried in a tight loop either
	// The offset belongs to one life of the stream: purging by it a stream
	// that was deleted and recreated would destroy undelivered messages.
	if !s.sameStream(ctx) {
		return
	}
	// Only the stream's leader answers a purge, and the scanner waits for
	// it: one not answered within hedge.AfterLeader is sent again, so a
	// hung leader holds the level's head until a new leader is elected, not
	// for jswire.OpTimeout. Copies purge the same prefix: one applied late
	// removes nothing more.
	pctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	_, err := hedge.Do(pctx, hedge.AfterLeader, func(ctx context.Context) (struct{}, error) {
		if s.hooks.losePurge != nil && s.hooks.losePurge(ctx, "purge") {
			<-ctx.Done()
			return struct{}{}, ctx.Err()
		}
		return struct{}{}, s.life.stream.Purge(ctx, jetstream.WithPurgeSequence(acked))
	})
	if err != nil {
		s.logger.Warn("purge failed", slog.Uint64("below", acked), slog.Any("error", err))
		return
	}
	s.pos.purgedTo = acked
}
