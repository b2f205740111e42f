package deliver

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/offsets"
)

// janitor runs the singleton jobs while this replica holds the janitor
// lease: the id index trim, and the sweep of membership keys left by
// replicas that stopped without leaving (a crash). Run builds it, values
// only; its elector runs [janitor.RunTerm] for each term of the lease.
type janitor struct {
	s       *Service
	store   *offsets.Store    // the committed offsets, as stored
	members *lease.Membership // the membership keys it sweeps
	levels  levelSet          // every level stream this replica knows, owned here or not
}

// newJanitor returns the janitor of lvls.
func (s *Service) newJanitor(store *offsets.Store, members *lease.Membership, lvls levelSet) *janitor {
	return &janitor{s: s, store: store, members: members, levels: lvls}
}

// RunTerm runs the singleton jobs for one term of the janitor lease, until
// ctx is done: the trim on this goroutine, the member sweep on one of its
// own that RunTerm starts and waits for, so nothing it started outlives
// the term.
func (j *janitor) RunTerm(ctx context.Context, _ ownership.Term) error {
	var wg sync.WaitGroup
	wg.Go(func() { j.sweepMembers(ctx) })
	err := j.trimIndex(ctx)
	wg.Wait()
	return err
}

// sweepMembers deletes, every memberSweepEvery until ctx is done, the
// membership keys seen unchanged for memberSweepAfter.
func (j *janitor) sweepMembers(ctx context.Context) {
	t := time.NewTicker(memberSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		n, err := j.members.Sweep(sctx, memberSweepAfter)
		cancel()
		if err != nil && ctx.Err() == nil {
			j.s.logger.Warn("membership sweep failed", slog.Any("error", err))
		}
		if n > 0 {
			j.s.logger.Info("membership keys of stopped replicas deleted", slog.Int("keys", n))
		}
	}
}

// A membership key seen unchanged for memberSweepAfter (its replica
// stopped without leaving) is deleted by the janitor.
const (
	memberSweepEvery = time.Minute
	memberSweepAfter = 10 * time.Minute
)

// trimIndex purges the id index every indexTrimEvery until ctx is done.
// It keeps every record stored since the oldest head any level had
// IndexKeep ago: a message that left its level (delivered or cancelled)
// within the last IndexKeep was at or behind a head then, so its records
// are kept, and a cancel still gets its true answer.
func (j *janitor) trimIndex(ctx context.Context) error {
	s := j.s
	js := mustJS(s.nc, 0)
	answerJS := mustJS(s.nc, answerInFlight)
	// Each pass's answer writes are confirmed (or given up) before the
	// next tick, so at the term's end none is in flight: the async
	// publisher's reply subscription and its reconnect listener go with
	// the term.
	defer answerJS.CleanupPublisher()
	reader, err := jswire.NewBatchReader(s.nc, index.Batch)
	if err != nil {
		return err
	}
	defer reader.Close()
	keep := cmp.Or(s.cfg.IndexKeep, IndexKeep)
	t := time.NewTicker(min(indexTrimEvery, keep/4))
	defer t.Stop()
	type sample struct {
		at     time.Time // when it was taken (delayd's clock)
		oldest time.Time // the oldest pending message then, or the server's time then (server clock)
	}
	var history []sample
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.hooks.trimPasses.Add(1)
		cutoff, err := j.oldestPending(ctx, js, reader)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("id index trim skipped", slog.Any("error", err))
			}
			continue
		}
		now := time.Now()
		history = append(history, sample{at: now, oldest: cutoff})
		// The newest sample at least IndexKeep old decides; older ones go.
		i := -1
		for j, h := range history {
			if now.Sub(h.at) >= keep {
				i = j
			}
		}
		if i < 0 {
			continue
		}
		cutoff, history = history[i].oldest, history[i:]
		if cutoff.IsZero() {
			continue
		}
		// Before its records go, each message's final answer is kept
		// (answerBeforeTrim), unless kept answers are off: the pass may
		// take a while behind a backlog, and never holds the trim beyond
		// the answers' bounds.
		var before func(ctx context.Context, first, end uint64) (uint64, error)
		if s.cfg.AnswerKeep != AnswerKeepOff {
			before = func(ctx context.Context, first, end uint64) (uint64, error) {
				return j.answerBeforeTrim(ctx, answerJS, reader, cutoff, first, end)
			}
		}
		tctx, cancel := context.WithTimeout(ctx, s.answers.work.bounds.passMax+2*jswire.OpTimeout)
		err = index.Trim(tctx, js, cutoff, indexStoreSkew, before)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("id index trim failed", slog.Any("error", err))
		}
	}
}

const indexTrimEvery = 10 * time.Second

// indexStoreSkew is how much earlier than its level message an index
// record may be stored: the router publishes the level write first, but the
// server stores writes to different streams on their own goroutines
// (seen even on an idle server). Trims keep this much more.
const indexStoreSkew = 5 * time.Second

// oldestPending returns the store time of the oldest message any level
// still holds past its committed offset, or the server's time if none: no
// index record of a message not yet handed off is older. The server's time
// is read first, so a message stored during the reads is newer than it.
// It costs a stream info, an offset read and a direct get per level.
func (j *janitor) oldestPending(ctx context.Context, js jetstream.JetStream, reader *jswire.BatchReader) (time.Time, error) {
	nctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	oldest := index.ServerNow(nctx, js)
	cancel()
	if oldest.IsZero() {
		return oldest, errors.New("no server time")
	}
	var buf []*nats.Msg
	for _, lvl := range j.levels {
		stream := lvl.Stream()
		// The committed offset as stored: the janitor's replica scans
		// only its share of the levels, and its own view of the others'
		// offsets is stale. A level it owns counts its latest commit.
		rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		committed, err := j.store.Load(rctx, stream)
		if errors.Is(err, offsets.ErrNotFound) {
			committed, err = 0, nil // never committed: from the first message
		}
		if err != nil {
			cancel()
			return time.Time{}, err
		}
		if latest, owned := lvl.Committed(); owned {
			committed = max(committed, latest)
		}
		buf, err = reader.Read(rctx, stream, buf[:0], committed+1, 1, 1)
		cancel()
		if err != nil {
			return time.Time{}, err
		}
		if len(buf) == 1 {
			if at, err := time.Parse(time.RFC3339Nano, buf[0].Header.Get(message.HdrJSTimeStamp)); err == nil && at.Before(oldest) {
				oldest = at
			}
		}
	}
	return oldest, nil
}
