// Package ownership runs a piece of delayd's work (the router, one level
// stream's scanner) only while this replica holds the work's lease, and
// hands the lease over when the work stops.
//
// An [Elector] owns one lease key ([internal/lease]): it acquires the
// lease, runs the work for exactly one term with a context that ends when
// the term does, and releases the lease once the work has returned. The
// work runs inside the term, so "settle, commit, then release" is a matter
// of structure, not of a comment: the release cannot start before the work
// (its in-flight deliveries confirmed, its offset committed) has returned.
// A release writes an empty holder, so a replica waiting for the lease
// takes it at once instead of after the TTL (docs/operations.md#configuration,
// DELAYD_LEASE_TTL).
//
// It follows River's internal/leadership.Elector: re-election on an
// interval with a TTL padded beyond it (the lease renews every TTL/3), a
// resignation with a fresh context on shutdown, and typed notifications of
// every change ([Event]: gained, lost, resigned) for the parts that need
// them and for tests, which wait on them instead of sleeping.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/internal/lease"
)

// Lease keys.
const (
	// RouterKey is the router's lease key when ingress is not partitioned:
	// one router routes ingress.
	RouterKey = "router"

	// levelKeyPrefix prefixes a level stream's (or partition stream's)
	// lease key: "level.DELAYD_5S", "level.DELAYD_1M-P0".
	levelKeyPrefix = "level."
)

// RouterPartitionKey returns the lease key of the router of ingress
// partition i when ingress is partitioned (DELAYD_INGRESS_PARTITIONS above
// 1): "router.<i>", e.g. "router.0".
func RouterPartitionKey(i int) string { return RouterKey + "." + strconv.Itoa(i) }

// LevelKey returns the lease key of a level stream or of one partition
// stream of a level: "level." + the stream name, e.g. "level.DELAYD_5S" or
// "level.DELAYD_1M-P0".
func LevelKey(stream string) string { return levelKeyPrefix + stream }

// releaseTimeout bounds the release write on a fresh context after the
// work returned.
const releaseTimeout = 5 * time.Second

// EventKind is the kind of an [Event].
type EventKind int

// Event kinds.
const (
	// Gained: this replica acquired the lease; the work starts.
	Gained EventKind = iota + 1
	// Lost: the term ended without a resignation (its fence passed with
	// no renewal stored, another holder wrote the key, or the work
	// stopped on its own, for example fenced at a failed
	// compare-and-set). The work has returned and the lease was released
	// if it could be.
	Lost
	// Resigned: the elector stopped (its context ended); the work has
	// returned and the lease was released, handing it over at once.
	Resigned
	// HandedOver: the [Balancer] asked this replica to give the lease up
	// (it held more than its share); the work has returned and the lease
	// was released for a replica below its share to take at once. Not a
	// failover.
	HandedOver
)

// String returns "gained", "lost" or "resigned".
func (k EventKind) String() string {
	switch k {
	case Gained:
		return "gained"
	case Lost:
		return "lost"
	case Resigned:
		return "resigned"
	case HandedOver:
		return "handed over"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one change of an elector's holding. Its instants are readings
// of this process's monotonic clock, only comparable within the process.
type Event struct {
	// Key is the lease key.
	Key string
	// Kind says what happened.
	Kind EventKind
	// Epoch is the term's epoch.
	Epoch uint64
	// Acquired is when the term's acquiring write was answered.
	Acquired time.Time
	// ValidUntil is, for Lost, Resigned and HandedOver, when the term's validity
	// ended: its fence, or the instant it was ended if earlier (a
	// release, a failed renewal); nothing fenced was written by this
	// replica for the term after it. Zero for Gained.
	ValidUntil time.Time
	// Fence is, for Lost, Resigned and HandedOver, the term's fence as it stood when
	// the work returned: when its validity would have ended without
	// another renewal. Without a release, no other replica can take the
	// lease before it; after a release (Resigned), one can. Zero for
	// Gained.
	Fence time.Time
	// Cause is, for Lost, Resigned and HandedOver, why the term ended
	// (wrapping lease.ErrExpired, lease.ErrLost or lease.ErrReleased) or
	// the work's own reason to stop; nil for Gained.
	Cause error
}

// Config configures an [Elector].
type Config struct {
	// Bucket is the lease bucket. Required.
	Bucket *lease.Bucket

	// Key is the lease key: [RouterKey] or [LevelKey]. Required.
	Key string

	// Holder is this replica's id (lease.NewHolderID), the same for every
	// elector of one process. Required.
	Holder string

	// TTL is the lease's TTL, T. Optional. Default lease.TTLDefault.
	TTL time.Duration

	// Balancer, if set, shares the leases of every elector it is given
	// to with the other live replicas: the elector bids only while this
	// replica holds less than its share (or for a lease left free for
	// the balancer's IdleBid), and hands its lease over when the balancer
	// asks. Optional. Default: bid for the lease whenever it is free.
	Balancer *Balancer

	// OnEvent is called with every [Event], on the elector's goroutine, in
	// order. It must not block (a counter, a test's buffered channel).
	// Optional.
	OnEvent func(Event)

	// Logger is optional. Default discards.
	Logger *slog.Logger

	// claimer, if set (tests only), is the lease's [lease.Claimer]
	// instead of Balancer.
	claimer lease.Claimer
}

// Term is one holding of the lease, as the work sees it.
type Term struct {
	// Epoch is the term's epoch: it increases on every change of holder.
	Epoch uint64

	lease      *lease.Lease
	recovering *atomic.Bool // the elector's; nil for the zero Term
}

// Recovering marks the term's work as recovering (on: starting, or
// restarting after a failure) or not. While it is, the [Balancer] does not
// ask the elector to hand its lease over: a hand-over then would add the
// next holder's start to the recovery (docs/operations.md#what-each-failure-costs).
// A work that never calls it is never recovering. Safe from any goroutine.
func (t Term) Recovering(on bool) {
	if t.recovering != nil {
		t.recovering.Store(on)
	}
}

// Held reports whether this term is still valid now: exact, on the
// monotonic clock (a mutex and a clock read: about 1.2 times a bare
// time.Now, BenchmarkTermHeld; cheap enough to call before every write). It turns false at the term's fence, before the term's
// context is cancelled (a timer, which may be late), and stays false. The
// zero Term (no lease: a part run on its own, outside a Service) is always
// held.
func (t Term) Held() bool {
	if t.lease == nil {
		return true
	}
	epoch, valid := t.lease.Held()
	return valid && epoch == t.Epoch
}

// Elector holds one lease key whenever it can and runs work for each term.
type Elector struct {
	lease   *lease.Lease
	key     string
	holder  string
	ttl     time.Duration
	onEvent func(Event)
	logger  *slog.Logger

	tried chan struct{} // closed once Run's first attempt is answered

	// recovering is set by the running term's work ([Term.Recovering]),
	// cleared by Run between terms; the balancer reads it.
	recovering atomic.Bool

	mu      sync.Mutex
	running bool
	yield   context.CancelCauseFunc // ends the running term's work; nil between terms
}

// New returns an elector for cfg.Key, not holding it. It returns an error
// for a missing Bucket, Key or Holder, an invalid key or a negative TTL.
func New(cfg Config) (*Elector, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TTL == 0 {
		cfg.TTL = lease.TTLDefault
	}
	if cfg.OnEvent == nil {
		cfg.OnEvent = func(Event) {}
	}
	logger := cfg.Logger.With(slog.String("lease", cfg.Key))
	lc := lease.Config{Key: cfg.Key, Holder: cfg.Holder, TTL: cfg.TTL, Logger: logger}
	if cfg.Balancer != nil {
		lc.Claimer = cfg.Balancer.Claimer()
	}
	if cfg.claimer != nil {
		lc.Claimer = cfg.claimer
	}
	l, err := lease.New(cfg.Bucket, lc)
	if err != nil {
		return nil, fmt.Errorf("leadership: %w", err)
	}
	e := &Elector{lease: l, key: cfg.Key, holder: cfg.Holder, ttl: cfg.TTL, onEvent: cfg.OnEvent, logger: logger, tried: make(chan struct{})}
	if cfg.Balancer != nil {
		cfg.Balancer.add(e)
	}
	return e, nil
}

// ErrHandedOver is the cause of a term's work context when the
// [Balancer] asked the elector to hand the lease over.
var ErrHandedOver = errors.New("leadership: handed over to balance the leases")

// handOver ends the running term's work with [ErrHandedOver], so that Run
// releases the lease; false if no term's work is running.
func (e *Elector) handOver() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.yield == nil {
		return false
	}
	e.yield(ErrHandedOver)
	return true
}

// Tried is closed once [Elector.Run]'s first attempt to take the lease is
// answered: taken, held by another replica, or failed (Run retries). A
// part that should start bidding only after others had their chance (the
// router after the scanners, so that a single process's scanners run
// before it routes) waits on it.
func (e *Elector) Tried() <-chan struct{} { return e.tried }

// Key returns the lease key.
func (e *Elector) Key() string { return e.key }

// Held reports whether this replica holds the lease now, and the last
// term's epoch (0 if none), valid or not. Safe from any goroutine.
func (e *Elector) Held() (epoch uint64, valid bool) { return e.lease.Held() }

// ErrRunning is returned by [Elector.Run] when it is already running.
var ErrRunning = errors.New("leadership: elector already running")

// Run acquires the lease and runs work for each term until ctx is done,
// then returns nil. work gets a context that ends when ctx does or the
// term ends (its cancellation comes from a timer and may be late: work
// checks [Term.Held] before each write), and must return once it is done.
// After work returns, Run releases the lease on a fresh context (bounded by
// 5 s), so another replica takes it at once, and announces Lost or
// Resigned. After a loss it tries to acquire again: a lease another
// replica took is taken back only once that replica stops renewing. After
// work stopped on its own while the term was still valid, Run waits one
// TTL before bidding again, so that another replica may take the lease.
//
// An error from work is returned (after the release) and ends Run: it
// means the work cannot run at all (a bad setup), not a lost term.
func (e *Elector) Run(ctx context.Context, work func(ctx context.Context, t Term) error) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return ErrRunning
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()
	first := true
	for {
		if first {
			first = false
			actx, cancel := context.WithTimeout(ctx, e.ttl)
			_, _ = e.lease.TryAcquire(actx) // a failure is retried, and logged, by Acquire
			cancel()
			close(e.tried)
		}
		if err := e.lease.Acquire(ctx); err != nil {
			return nil // ctx is done
		}
		epoch, valid := e.lease.Held()
		if !valid {
			continue // ended between Acquire and now
		}
		e.recovering.Store(false)
		term := Term{Epoch: epoch, lease: e.lease, recovering: &e.recovering}
		info := e.lease.LastTerm()
		// At debug: a replica gains its leases in bursts (about 30 at
		// start with the default table, a dead replica's share at a
		// failover), which the OnEvent subscriber summarises in one line
		// at info (deliver's "leases gained"). Hand-overs and losses
		// below stay at info and warn, one line each.
		e.logger.Debug("lease gained", slog.Uint64("epoch", epoch))
		e.onEvent(Event{Key: e.key, Kind: Gained, Epoch: epoch, Acquired: info.Acquired})

		wctx, cancel := context.WithCancelCause(ctx)
		e.mu.Lock()
		e.yield = cancel
		e.mu.Unlock()
		tctx := e.lease.Context()
		stop := context.AfterFunc(tctx, func() { cancel(context.Cause(tctx)) })
		werr := work(wctx, term)
		stop()
		e.mu.Lock()
		e.yield = nil
		e.mu.Unlock()
		e.recovering.Store(false)
		handedOver := errors.Is(context.Cause(wctx), ErrHandedOver)
		stillValid := term.Held()
		before := e.lease.LastTerm() // why it ended, if it did, before the release ends it
		cancel(nil)

		rctx, rcancel := context.WithTimeout(context.Background(), releaseTimeout)
		rerr := e.lease.Release(rctx)
		rcancel()
		if rerr != nil {
			e.logger.Warn("lease release failed; others take it after its TTL", slog.Uint64("epoch", epoch), slog.Any("error", rerr))
		}
		info = e.lease.LastTerm()
		ev := Event{Key: e.key, Kind: Lost, Epoch: epoch, Acquired: info.Acquired, ValidUntil: info.ValidUntil,
			Fence: before.ValidUntil, Cause: info.Cause}
		switch {
		case ctx.Err() != nil:
			ev.Kind = Resigned
			e.logger.Debug("lease released", slog.Uint64("epoch", epoch))
		case handedOver && stillValid && werr == nil:
			ev.Kind = HandedOver
			e.logger.Info("lease handed over to balance the replicas' shares", slog.Uint64("epoch", epoch))
		case stillValid:
			// The work stopped on its own: werr, or fenced by a failed
			// compare-and-set it logged.
			ev.Cause = cmpErr(werr, errors.New("the work stopped while the term was valid"))
			e.logger.Warn("lease given up: the work stopped", slog.Uint64("epoch", epoch), slog.Any("cause", ev.Cause))
		default:
			ev.Cause = cmpErr(before.Cause, fmt.Errorf("%w: epoch %d, its fence passed", lease.ErrExpired, epoch))
			e.logger.Warn("lease lost", slog.Uint64("epoch", epoch), slog.Any("cause", ev.Cause))
		}
		e.onEvent(ev)
		if werr != nil {
			return werr
		}
		if ctx.Err() != nil {
			return nil
		}
		if stillValid && !handedOver {
			t := time.NewTimer(e.ttl)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
	}
}

// cmpErr returns err, or def if err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
