package offsets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// CommitTimeoutDefault bounds one offset write of a [Committer].
const CommitTimeoutDefault = 10 * time.Second

// CommitterConfig configures a [Committer].
type CommitterConfig struct {
	// Stream is the level stream whose offset is committed, e.g.
	// "DELAYD_5S". Required.
	Stream string

	// Timeout bounds one offset write. Optional. Default
	// [CommitTimeoutDefault].
	Timeout time.Duration

	// Logger receives failed writes. Optional. Default discards.
	Logger *slog.Logger
}

// Committer commits one level stream's offset, pipelined behind the
// deliveries it confirms: [Committer.Commit] returns at once, and the write
// runs on the committer's own goroutine. One write is in flight at a time;
// offsets committed meanwhile are coalesced, and only the latest is written
// once the write in flight is answered. An offset counts as acknowledged
// ([Committer.Acked]) only once the KV bucket's PubAck for it arrived.
//
// A failed write is logged and not retried: the next higher offset given
// to Commit supersedes it. Losing a write (a crash, a failure) only means a
// few more re-deliveries after a restart, never a loss, since an offset is
// committed only after its hand-offs were confirmed.
//
// Goroutines: Commit, Settle and Reset belong to one goroutine, the level's
// scanner, which decides the order of offsets. Committed, Acked and
// Revision may be called from any goroutine. The committer's state is
// guarded by one mutex; its write goroutine exists only while a write is in
// flight or waiting.
//
// Each write records the KV revision it got, so that a write can later be
// made conditional on the revision last written (a compare-and-set).
type Committer struct {
	store   *Store
	stream  string
	timeout time.Duration
	logger  *slog.Logger

	mu      sync.Mutex
	gen     uint64        // incremented by Reset: older writes no longer count
	want    uint64        // the latest offset given to Commit
	sent    uint64        // the latest offset a write was started for
	writing chan struct{} // closed when the write goroutine ends; nil if none runs
	err     error         // the last write's error; nil after a success
	rev     uint64        // the KV revision of the last acknowledged write; 0 if unknown

	committed atomic.Uint64 // == want, for readers on other goroutines
	acked     atomic.Uint64
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
	return &Committer{store: store, stream: cfg.Stream, timeout: cfg.Timeout, logger: cfg.Logger}, nil
}

// Commit makes seq the stream's offset to store and returns at once. The
// write starts now if none is in flight, else when the one in flight is
// answered; a later Commit before then replaces seq. Committing the latest
// offset again is a no-op. Moving it backwards returns [ErrRegress] and
// changes nothing.
//
// ctx's values reach the write, but not its cancellation: a write started
// just before the scanner stops still completes, bounded by the
// committer's Timeout, so a clean stop loses no commit ([Committer.Settle]
// waits for it).
func (c *Committer) Commit(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
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
		seq := c.want
		c.sent = seq
		c.mu.Unlock()

		wctx, cancel := context.WithTimeout(ctx, c.timeout)
		rev, err := c.store.put(wctx, c.stream, seq)
		cancel()

		c.mu.Lock()
		if gen == c.gen {
			c.err = err
			if err == nil {
				c.rev = rev
				c.acked.Store(seq)
			}
		}
		c.mu.Unlock()
		if err != nil {
			c.logger.Warn("offset commit failed; the next one supersedes it", slog.String("stream", c.stream), slog.Uint64("offset", seq), slog.Any("error", err))
		}
	}
}

// Settle waits until every offset given to Commit was written, or ctx is
// done. It returns nil if the latest offset is acknowledged, the failed
// write's error if its write failed, or ctx's error if ctx ended first.
func (c *Committer) Settle(ctx context.Context) error {
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
	if c.err != nil {
		return c.err
	}
	return nil
}

// Reset starts counting from offset, as loaded or corrected at a
// (re)start: Committed and Acked both return it, and nothing waits to be
// written. Call it after [Committer.Settle]; a write still in flight then
// (Settle ran out of time) no longer moves Acked when it is answered.
// Revision reads 0 (unknown) until the next acknowledged write.
func (c *Committer) Reset(offset uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.want, c.sent, c.writing, c.err, c.rev = offset, offset, nil, nil, 0
	c.committed.Store(offset)
	c.acked.Store(offset)
}

// Committed returns the latest offset given to Commit (or Reset), written
// or not. Safe from any goroutine.
func (c *Committer) Committed() uint64 { return c.committed.Load() }

// Acked returns the latest offset whose write the KV bucket acknowledged
// (or the offset given to Reset). It never passes Committed. Safe from any
// goroutine.
func (c *Committer) Acked() uint64 { return c.acked.Load() }

// Revision returns the KV revision of the last acknowledged write; 0 if
// none since the last Reset. Safe from any goroutine.
func (c *Committer) Revision() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}
