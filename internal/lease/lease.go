package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a [Lease].
type Config struct {
	// Key is the lease's key in the bucket, e.g. "router" or
	// "level.DELAYD_5S": KV key characters (letters, digits, "-_=/."). Required.
	Key string

	// Holder is this replica's id, written into the value. Required; use
	// [NewHolderID]. Every Lease of one process uses the same id.
	Holder string

	// TTL is T. Optional. Default [TTLDefault]. Renewals run every TTL/3.
	TTL time.Duration

	// Margin is how much earlier than T after its last renewal a holder
	// stops (see the package's Safety section). Optional. Default TTL/10.
	// Must be less than TTL/3, so a holder renewing on time never stops.
	Margin time.Duration

	// Claimer, if set, is asked before every write that would take the
	// lease (see [Claimer]): a replica that balances its leases with others
	// bids only while it is below its share. Optional. Default: always bid.
	Claimer Claimer

	// Logger receives failed renewals and losses. Optional. Default
	// discards.
	Logger *slog.Logger
}

// Claimer decides whether this replica bids for a lease that is free to
// take now: released, never written, or (held by another) unchanged for
// the TTL.
type Claimer interface {
	// Claim is asked before the write that would take the lease key,
	// which has been free to take for idle (measured on this process's
	// monotonic clock from the first read that showed its current
	// revision; for a key held by another, minus the TTL). ok false: no
	// bid now (the lease asks again at its next attempt). When ok, done
	// is called once the write is answered, taken or not; until then the
	// claim counts as held.
	Claim(key string, idle time.Duration) (done func(), ok bool)
}

// Lease is one key's lease, held by this replica or not. It is safe for
// concurrent use. While a term is held, one goroutine renews it.
//
// It is lock-guarded term state, by design: mu guards the seen* fields and
// holding, and every other field is set by New and never written after.
// Its methods run on the elector's goroutine (TryAcquire, Acquire,
// Release, Context, LastTerm, and Held before each of the work's writes),
// the term's renew goroutine and its expiry timer (renew, expire: each
// ends the term on its own), the balancer's (Held, Observed, Wake) and
// stats readers (Held); watch reads only what New set. The expiry must
// not wait for the elector's goroutine, which runs the work and may be
// blocked in it: a holder must never believe it holds past its term, so
// Held reads the fence under the lock the renewals and the expiry write it
// under (docs/reshape.md, R4 goroutines).
type Lease struct {
	kv     jetstream.KeyValue
	key    string
	holder string
	ttl    time.Duration
	margin time.Duration
	logger *slog.Logger

	claimer Claimer
	wake    chan struct{} // Wake: Acquire tries again at once

	hooks testHooks // tests only; zero in production

	mu sync.Mutex
	// The revision last seen in a Get (0: the key was never written), and
	// when (after its response) it was first seen: a contender takes over
	// a held key only T after seenAt. seen is false until a Get and after
	// a term began.
	seen       bool
	seenWait   bool // the key seen is held by another (or unreadable): taken only T after seenAt
	seenRev    uint64
	seenAt     time.Time
	seenHolder string   // the holder the last Get showed; "" if released or unreadable
	holding    *holding // the current term, or the last (ended); nil until the first. Ended ones are replaced, not reused
}

// testHooks are a [Lease]'s test hooks (export_test.go sets them); all
// zero outside tests.
type testHooks struct {
	pauseRenewals atomic.Bool   // the renew goroutine skips its renewals, as a paused holder
	holdExpiry    atomic.Bool   // the expiry timer does not end the term, as a late timer
	watchReady    chan struct{} // if set, a watch waits for it before it is created
}

// holding is one term of the lease (one holding of its key by this Lease),
// from acquisition to its end.
type holding struct {
	epoch    uint64
	acquired time.Time // the acquiring write's response
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stop     chan struct{} // closed to stop renewing
	renewing chan struct{} // closed when the renew goroutine ends

	// Guarded by Lease.mu.
	rev     uint64      // revision of this term's last successful write
	fence   time.Time   // last successful write's send time + TTL - margin
	timer   *time.Timer // fires at fence
	ended   bool
	endedAt time.Time // when ended was set
}

// New returns a lease on cfg.Key in b, not held. It returns an error for a
// missing Key or Holder, a Key that is not a valid KV key, or a TTL or
// Margin out of range.
func New(b *Bucket, cfg Config) (*Lease, error) {
	switch {
	case b == nil:
		return nil, errors.New("lease: a bucket is required")
	case cfg.Key == "":
		return nil, errors.New("lease: Key is required")
	case !validKey(cfg.Key):
		return nil, fmt.Errorf("lease: Key %q: only letters, digits and -_=/. allowed, not starting or ending with .", cfg.Key)
	case cfg.Holder == "":
		return nil, errors.New("lease: Holder is required")
	case cfg.TTL < 0:
		return nil, fmt.Errorf("lease: TTL %s: must not be negative", cfg.TTL)
	}
	if cfg.TTL == 0 {
		cfg.TTL = TTLDefault
	}
	if cfg.Margin == 0 {
		cfg.Margin = cfg.TTL / 10
	}
	if cfg.Margin < 0 || cfg.Margin >= cfg.TTL/3 {
		return nil, fmt.Errorf("lease: Margin %s: must be positive and less than TTL/3 (%s)", cfg.Margin, cfg.TTL/3)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Lease{kv: b.kv, key: cfg.Key, holder: cfg.Holder, ttl: cfg.TTL, margin: cfg.Margin, claimer: cfg.Claimer,
		wake: make(chan struct{}, 1), logger: cfg.Logger.With(slog.String("lease", cfg.Key))}, nil
}

func validKey(k string) bool {
	if k[0] == '.' || k[len(k)-1] == '.' {
		return false
	}
	for _, c := range k {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '=', c == '/', c == '.':
		default:
			return false
		}
	}
	return true
}

// Key returns the lease's key.
func (l *Lease) Key() string { return l.key }

// Held reports whether this replica holds the lease now, and the term's
// epoch. It reads the monotonic clock: valid is false from the fence
// instant on, even if the renew goroutine has not run yet. epoch is the
// last term's epoch (0 if none), valid or not.
func (l *Lease) Held() (epoch uint64, valid bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.holding
	if t == nil {
		return 0, false
	}
	return t.epoch, !t.ended && time.Now().Before(t.fence)
}

// Deadline returns the current term's fence: the instant, on this process's
// monotonic clock, at which the term stops being valid unless renewed
// first. ok is false if no term is held. The time is only meaningful in
// this process (for [context.WithDeadline] or [time.Until]); never send it
// elsewhere.
func (l *Lease) Deadline() (fence time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.holding; t != nil && !t.ended {
		return t.fence, true
	}
	return time.Time{}, false
}

// Context returns the current term's context: it is cancelled when the term
// ends, with a cause wrapping [ErrExpired] (its fence passed), [ErrLost]
// (another holder wrote the key) or [ErrReleased]. Without a term it
// returns an already cancelled context with cause [ErrNotHeld]. Its
// cancellation comes from a timer and may be late; see [Lease.Held].
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.holding; t != nil && !t.ended {
		return t.ctx
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(ErrNotHeld)
	return ctx
}

// TermInfo describes a term, on this process's monotonic clock: its
// instants are only meaningful in this process.
type TermInfo struct {
	// Epoch is the term's epoch; 0 if there was no term.
	Epoch uint64
	// Acquired is when the acquiring write was answered: validity began.
	Acquired time.Time
	// ValidUntil is when validity ended or ends: the fence, or the instant
	// the term ended if that came first (a release, a failed renewal's
	// compare-and-set). A holder writes nothing fenced after it.
	ValidUntil time.Time
	// Ended reports whether the term has ended.
	Ended bool
	// Cause is why it ended, wrapping [ErrExpired], [ErrLost] or
	// [ErrReleased]; nil while not ended.
	Cause error
}

// LastTerm returns the last term's [TermInfo], ended or not; the zero
// TermInfo if this Lease never held a term.
func (l *Lease) LastTerm() TermInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.holding
	if t == nil {
		return TermInfo{}
	}
	ti := TermInfo{Epoch: t.epoch, Acquired: t.acquired, ValidUntil: t.fence, Ended: t.ended}
	if t.ended {
		ti.Cause = context.Cause(t.ctx)
		if t.endedAt.Before(t.fence) {
			ti.ValidUntil = t.endedAt
		}
	}
	return ti
}
