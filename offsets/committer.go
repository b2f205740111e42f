package offsets

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
)

// CommitTimeoutDefault bounds one offset write of a [Committer].
const CommitTimeoutDefault = 10 * time.Second

// CommitAttemptDefault bounds one copy of a fenced offset write: a copy not
// answered within it is sent again, until the write's Timeout. A write goes
// to the bucket's stream leader, and one that hangs never answers; the
// copy sent again reaches the new leader once JetStream has elected one
// (docs/design.md#re-sent-writes-to-a-hung-leader).
const CommitAttemptDefault = 2 * time.Second

// CommitterConfig configures a [Committer].
type CommitterConfig struct {
	// Stream is the level stream whose offset is committed, e.g.
	// "DELAYD_5S". Required.
	Stream string

	// Timeout bounds one offset write. Optional. Default
	// [CommitTimeoutDefault]. A fenced write ([CommitterConfig.Fenced]) is
	// sent in copies, each bounded by [CommitAttemptDefault] (or Timeout if
	// shorter), until one is answered or Timeout has passed.
	Timeout time.Duration

	// Fenced makes every write a compare-and-set at the revision of the
	// previous one (jetstream KeyValue.Update), starting from the revision
	// given to [Committer.ResetAt]. Once a write fails its compare-and-set
	// (another owner bumped the key, [Store.Bump]), the committer is fenced:
	// it writes nothing more, and Commit and Await return [ErrFenced].
	// A copy of a write not answered within its attempt is sent again
	// (the same value at the same revision, carrying the same write id); a
	// copy refused for the revision reads the key back, and an entry with
	// its write id is its own earlier copy, applied: a success at that
	// entry's revision, not a fence (docs/design.md#re-sent-writes-to-a-hung-leader).
	// A write whose outcome is still unknown at Timeout may have been
	// stored; the next write then fails as fenced. That is conservative: an
	// owner that still holds the level stream bumps again ([Store.Bump])
	// and resets ([Committer.ResetAt]). Optional. Default false: every
	// write is a plain put, sent once (a put sent again could land after a
	// later one and move the offset back).
	Fenced bool

	// Logger receives failed writes. Optional. Default discards.
	Logger *slog.Logger
}

// Committer commits one level stream's offset, pipelined behind the
// deliveries it confirms: [Committer.Commit] returns at once, and the write
// runs on the committer's own goroutine. One write is in flight at a time;
// offsets committed meanwhile are coalesced, and only the latest is written
// once the write in flight is answered. An offset counts as stored
// ([Committer.Stored]) only once the KV bucket's PubAck for it arrived.
//
// A failed write is logged and not retried: the next higher offset given
// to Commit supersedes it. Losing a write (a crash, a failure) only means a
// few more re-deliveries after a restart, never a loss, since an offset is
// committed only after its hand-offs were confirmed.
//
// Goroutines: Commit, Await and Reset belong to one goroutine, the level's
// scanner, which decides the order of offsets. Committed, Stored and
// Revision may be called from any goroutine. The committer's state is
// guarded by one mutex; its write goroutine exists only while a write is in
// flight or waiting.
//
// Each write records the KV revision it got. With [CommitterConfig.Fenced]
// the next write is conditional on it (a compare-and-set), so a replica
// that lost the level stream to a new owner cannot overwrite the new
// owner's offset: its next write fails with [ErrFenced] and the committer
// stops writing. Fenced writes stay one in flight, so each knows the
// revision it must find.
type Committer struct {
	store   *Store
	stream  string
	timeout time.Duration
	attempt time.Duration // one copy of a fenced write
	fenced  bool
	logger  *slog.Logger
	idPre   string // "<random>-": write ids are idPre and a count

	// lose, for tests, drops the answer to a fenced write's copy n (n
	// counting every copy from 1) when it returns true, as if lost in a hung
	// node's socket: the copy was sent (and may be applied) and is taken
	// for unanswered.
	lose func(n uint64) bool

	writes atomic.Uint64 // fenced writes started: the count in their write ids
	copies atomic.Uint64 // copies of fenced writes sent (lose)

	mu      sync.Mutex
	gen     uint64        // incremented by Reset: older writes no longer count
	want    uint64        // the latest offset given to Commit
	sent    uint64        // the latest offset a write was started for
	writing chan struct{} // closed when the write goroutine ends; nil if none runs
	err     error         // the last write's error; nil after a success
	rev     uint64        // the KV revision of the last acknowledged write (or ResetAt's); 0 if unknown
	fence   error         // non-nil once a fenced write failed its compare-and-set

	committed atomic.Uint64 // == want, for readers on other goroutines
	stored    atomic.Uint64 // the latest offset the KV bucket acknowledged, for readers on other goroutines
}

// NewCommitter returns a committer for cfg.Stream's offset in store,
// starting at offset 0, neither written nor to be written. Call
// [Committer.Reset] with the loaded offset before the first Commit.
func NewCommitter(store *Store, cfg CommitterConfig) (*Committer, error) {
	if store == nil {
		return nil, errors.New("offsets: committer: a store is required")
	}
	if cfg.Stream == "" {
		return nil, errors.New("offsets: committer: Stream is required")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("offsets: committer: Timeout %s: must not be negative", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = CommitTimeoutDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Committer{
		store: store, stream: cfg.Stream, timeout: cfg.Timeout, attempt: min(cfg.Timeout, CommitAttemptDefault),
		fenced: cfg.Fenced, logger: cfg.Logger, idPre: rand.Text()[:16] + "-",
	}, nil
}

// Commit makes seq the stream's offset to store and returns at once. The
// write starts now if none is in flight, else when the one in flight is
// answered; a later Commit before then replaces seq. Committing the latest
// offset again is a no-op. Moving it backwards returns [ErrRegress] and
// changes nothing. Once the committer is fenced it returns an error
// wrapping [ErrFenced] and changes nothing.
//
// ctx's values reach the write, but not its cancellation: a write started
// just before the scanner stops still completes, bounded by the
// committer's Timeout, so a clean stop loses no commit ([Committer.Await]
// waits for it).
func (c *Committer) Commit(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.fence != nil:
		return c.fence
	case seq == c.want:
		return nil
	case seq < c.want:
		return fmt.Errorf("%w: %s from %d to %d", ErrRegress, c.stream, c.want, seq)
	}
	c.want = seq
	c.committed.Store(seq)
	if c.writing == nil {
		c.writing = make(chan struct{})
		go c.write(context.WithoutCancel(ctx), c.gen, c.writing)
	}
	return nil
}

// write stores the latest offset until none is waiting. It runs on its own
// goroutine, one at a time per generation, and ends when it has nothing to
// write or Reset started a new generation.
func (c *Committer) write(ctx context.Context, gen uint64, done chan struct{}) {
	defer close(done)
	for {
		c.mu.Lock()
		if gen != c.gen || c.want == c.sent {
			if gen == c.gen {
				c.writing = nil
			}
			c.mu.Unlock()
			return
		}
		if c.fence != nil {
			c.writing = nil
			c.mu.Unlock()
			return
		}
		seq, prev := c.want, c.rev
		c.sent = seq
		c.mu.Unlock()

		var rev uint64
		var err error
		if c.fenced {
			rev, err = c.update(ctx, seq, prev)
		} else {
			wctx, cancel := context.WithTimeout(ctx, c.timeout)
			rev, err = c.store.put(wctx, c.stream, seq)
			cancel()
		}

		c.mu.Lock()
		if gen == c.gen {
			c.err = err
			if err == nil {
				c.rev = rev
				c.stored.Store(seq)
			} else if errors.Is(err, ErrFenced) {
				c.fence = err
			}
		}
		c.mu.Unlock()
		if errors.Is(err, ErrFenced) {
			c.logger.Warn("offset commit fenced: another owner wrote the offset; committing nothing more", slog.String("stream", c.stream), slog.Uint64("offset", seq), slog.Uint64("revision", prev), slog.Any("error", err))
		} else if err != nil {
			c.logger.Warn("offset commit failed; the next one supersedes it", slog.String("stream", c.stream), slog.Uint64("offset", seq), slog.Any("error", err))
		}
	}
}

// update writes seq at revision prev, fenced, within the committer's
// Timeout: in copies of one write (one write id), each bounded by the
// attempt, sent again while unanswered ([Store.writeCopies]).
func (c *Committer) update(ctx context.Context, seq, prev uint64) (uint64, error) {
	return c.store.writeCopies(ctx, copyWrite{
		stream: c.stream, seq: seq, rev: prev, id: c.idPre + strconv.FormatUint(c.writes.Add(1), 10),
		attempt: c.attempt, bound: c.timeout, logger: c.logger,
		lost: func() bool { n := c.copies.Add(1); return c.lose != nil && c.lose(n) },
	})
}

// copyWrite is one fenced offset write, sent in copies by
// [Store.writeCopies].
type copyWrite struct {
	stream   string
	seq, rev uint64 // the offset, written at the key's revision rev
	id       string // unique to the write, the same in every copy ([writeIDHeader])
	attempt  time.Duration
	bound    time.Duration // from the first copy: no copy is sent after it
	logger   *slog.Logger
	lost     func() bool // called after each copy; true drops its answer (tests); nil never
}

// writeCopies writes w.seq at revision w.rev, fenced, within w.bound: in
// copies of one write (one write id), each bounded by w.attempt, sent
// again while unanswered. A copy refused for the revision after an earlier
// copy went unanswered reads the key back: its own write id there means an
// earlier copy was applied, and the write succeeded at that revision. Safe
// because every copy is a compare-and-set at w.rev: however many copies
// are sent, and whenever a copy held in a hung node is applied, at most one
// is applied, and only while the key is still at w.rev, so none can
// overwrite another owner's write or move the offset back
// (docs/design.md#re-sent-writes-to-a-hung-leader).
func (s *Store) writeCopies(ctx context.Context, w copyWrite) (uint64, error) {
	deadline := time.Now().Add(w.bound)
	seq, prev, id := w.seq, w.rev, w.id
	unanswered := false // a copy of this write went unanswered: it may be applied
	for {
		left := time.Until(deadline)
		actx, cancel := context.WithTimeout(ctx, min(w.attempt, left))
		rev, err := s.updateTagged(actx, w.stream, seq, prev, id)
		cancel()
		if w.lost != nil && w.lost() {
			rev, err = 0, fmt.Errorf("offsets: commit %s=%d: answer lost (test): %w", w.stream, seq, context.DeadlineExceeded)
		}
		switch {
		case err == nil:
			return rev, nil
		case errors.Is(err, ErrFenced) && unanswered:
			// Whose write moved the key: this write's earlier copy, or
			// another owner's? Read until a replica shows it.
			for {
				rctx, cancel := context.WithTimeout(ctx, min(w.attempt, time.Until(deadline)))
				own, stale, at, rerr := s.ownWrite(rctx, w.stream, prev, id)
				cancel()
				switch {
				case rerr == nil && own:
					w.logger.Debug("offset commit re-sent: its first copy was applied", slog.String("stream", w.stream), slog.Uint64("offset", seq), slog.Uint64("revision", at))
					s.noteCommitted(w.stream, seq)
					return at, nil
				case rerr == nil && !stale:
					return 0, err // another owner's write: fenced
				}
				if time.Until(deadline) <= 0 || ctx.Err() != nil {
					// Unknown: conservatively fenced, as an unanswered
					// write's next write would be.
					return 0, err
				}
				time.Sleep(50 * time.Millisecond) // a replica behind catches up within milliseconds
			}
		case !hedge.IsTimeout(err) && !errors.Is(err, jetstream.ErrNoStreamResponse):
			return 0, err // an answer: a refusal
		}
		unanswered = true
		if time.Until(deadline) <= 0 || ctx.Err() != nil {
			return 0, err
		}
	}
}

// Await waits until every offset given to Commit was written, or ctx is
// done. It returns nil if the latest offset is acknowledged, the failed
// write's error if its write failed (wrapping [ErrFenced] once fenced), or
// ctx's error if ctx ended first.
func (c *Committer) Await(ctx context.Context) error {
	c.mu.Lock()
	done := c.writing
	c.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("offsets: commit %s=%d unconfirmed: %w", c.stream, c.Committed(), ctx.Err())
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fence != nil {
		return c.fence
	}
	if c.err != nil {
		return c.err
	}
	return nil
}

// Reset starts counting from offset, as loaded or corrected at a
// (re)start: Committed and Stored both return it, and nothing waits to be
// written. Call it after [Committer.Await]; a write still in flight then
// (Await ran out of time) no longer moves Stored when it is answered.
// Revision reads 0 (unknown) until the next acknowledged write. It is
// ResetAt(offset, 0).
func (c *Committer) Reset(offset uint64) { c.ResetAt(offset, 0) }

// ResetAt is [Committer.Reset] that also sets the KV revision the next
// fenced write expects: the revision [Store.LoadRevision] or [Store.Bump]
// returned (0: the key must not exist yet). It clears a fence, for a
// replica that owns the level stream again after a new bump.
func (c *Committer) ResetAt(offset, revision uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.want, c.sent, c.writing, c.err, c.rev, c.fence = offset, offset, nil, nil, revision, nil
	c.committed.Store(offset)
	c.stored.Store(offset)
}

// Fenced reports whether a fenced write failed its compare-and-set since
// the last Reset: another owner wrote the offset. Safe from any goroutine.
func (c *Committer) Fenced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fence != nil
}

// Committed returns the latest offset given to Commit (or Reset), written
// or not. Safe from any goroutine.
func (c *Committer) Committed() uint64 { return c.committed.Load() }

// Stored returns the latest offset whose write the KV bucket acknowledged
// (or the offset given to Reset). It never passes Committed. Safe from any
// goroutine.
func (c *Committer) Stored() uint64 { return c.stored.Load() }

// Revision returns the KV revision of the last acknowledged write; 0 if
// none since the last Reset. Safe from any goroutine.
func (c *Committer) Revision() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}
