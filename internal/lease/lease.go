// Package lease gives a delayd replica fenced, exclusive ownership of one
// piece of work (the router, a level stream or partition, a singleton job)
// through a key in the DELAYD_LEASES JetStream key-value bucket.
//
// It lives in internal/ rather than deliver/internal/ because more than
// deliver reads leases: cmd/delayd (readiness: a replica that can take a
// lease) and cmd/delayctl (stats: which replica owns what, at which epoch)
// decode the same values.
//
// # Protocol
//
// A lease is one key. Its value ([Value]) names the holder and its epoch,
// as JSON: {"v":1,"holder":"host-1234-9f2c","epoch":7}. T is the lease's
// TTL ([Config.TTL], default [TTLDefault], 1.5 s).
//
//   - Acquire: Create the key (epoch 1); or, when the key names a holder
//     (or was deleted, purged or garbled by hand), Update it at a revision
//     seen unchanged for T on the local monotonic clock, counted from the
//     first Get response that showed that revision; or, when its holder is
//     empty (released), Update at once. The new epoch
//     is the old one + 1. A key deleted or purged by hand, or a value that
//     does not decode, is replaced with epoch = its revision + 1, which
//     exceeds every epoch written before (an epoch e is always written at a
//     revision >= e), so epochs strictly increase on every change of holder.
//   - Renew: every T/3, Update at the revision the holder last wrote, with
//     the same value.
//   - Fence: the holder's term is valid until (the send time of its last
//     successful write + T - margin), on its monotonic clock. A failed
//     compare-and-set (someone else wrote the key) ends the term at once. A
//     renewal that fails otherwise (a timeout, no responders during a NATS
//     election) is retried at the next tick; the term expires at its fence
//     if none succeeds.
//   - Release: end the term, then Update the key at the held revision to an
//     empty holder with the same epoch, so a waiting replica takes it at
//     once instead of after T.
//
// Membership ([Membership]): each replica also writes a key
// "member.<holder>", renewed every T/3 and deleted when it stops; another
// replica counts it live while it sees the key's revision change within T.
// The keys carry the settings every live replica must share (the level
// table), checked at start, and let replicas balance their leases
// ([Gate]). (Not a per-key TTL: nats.go's Update and Put clear a key's TTL,
// and enabling TTLs on the bucket cannot be undone, so an older delayd's
// idempotent bucket update would then fail.)
//
// No wall clock of one machine is ever compared with another's: every
// instant above is a [time.Now] reading compared, through its monotonic
// part, with another reading of the same process.
//
// # Safety
//
// Claim: two terms of one lease are never valid at the same real instant.
// Assumption: every replica's monotonic clock runs at a rate within rho of
// real time (|rate - 1| <= rho), and margin >= 2*rho*T/(1+rho); the default
// margin T/10 tolerates rho up to 5 %, far beyond any quartz clock (about
// 1e-4). Clocks need not be synchronised.
//
// Suppose A's last successful write, sent at real time sA, stored revision
// r. A's term ends no later than real time sA + (T-margin)/(1-rho). A
// contender B that takes the lease from A Updates at revision r (an Update
// at any other revision fails: the key's revision is a compare-and-set
// token). B saw r first in a Get response that arrived at real time
// oB >= sA (r was stored after A sent it, and B read it after it was
// stored), and sends its Update only after T more on its own clock, at real
// time >= sA + T/(1+rho) >= sA + (T-margin)/(1-rho). So B's term starts
// after A's ended. If A's renewal at r is stored first, B's Update fails;
// if B's is, A's next renewal fails and A's term ends at once (it had
// already expired by the argument above). A release ends A's term before
// its empty-holder write is sent, so a taker after a release is safe too.
//
// Limits, stated honestly:
//   - A term's validity is a check at one instant. A holder paused between
//     [Lease.Held] and its write (a GC pause, SIGSTOP) writes after its
//     fence. So every fenced write must also carry its own compare-and-set
//     (an offset commit at the offset key's revision, an expected last
//     sequence on a level stream); the lease decides who should write, the
//     compare-and-set makes a stale write fail.
//   - Go's monotonic clock on Linux is CLOCK_MONOTONIC, which stops while
//     the machine is suspended. A holder on a suspended machine wakes up
//     believing no time passed; the compare-and-set on its writes is then
//     the only fence. A stopped process (SIGSTOP) or a paused goroutine is
//     fine: the clock keeps running.
//   - [Lease.Context] is cancelled by a timer at the fence instant, so a
//     paused process sees it late. [Lease.Held] reads the clock and is exact.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketName is the key-value bucket that holds the leases.
const BucketName = "DELAYD_LEASES"

// TTLDefault is a lease's default TTL, T: a holder that cannot renew for T
// loses the lease to a contender, and its own term ends T - margin after
// its last successful renewal was sent.
const TTLDefault = 1500 * time.Millisecond

// ValueVersion is the version of the [Value] encoding this package writes.
const ValueVersion = 1

// BucketConfig configures [OpenBucket].
type BucketConfig struct {
	// Replicas is the bucket's replica count: 3 on a 3-node cluster (R3),
	// 1 on a single server. Optional. Default 1.
	Replicas int
}

// Bucket is the [BucketName] key-value bucket. It is safe for concurrent
// use; each [Lease] owns one key in it.
type Bucket struct {
	kv jetstream.KeyValue
	js jetstream.JetStream // for the bucket's stream state; nil in some tests
}

// OpenBucket creates or updates the [BucketName] bucket (file storage,
// history 1) and returns it. It returns an error for Replicas < 0 and when
// JetStream refuses the bucket (for example more replicas than nodes).
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Bucket, error) {
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("lease: replicas %d: must be at least 1", cfg.Replicas)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketName,
		Description: `delayd: leases, one key per owned piece of work; value {"v":1,"holder":...,"epoch":...}`,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lease: create bucket %s: %w", BucketName, err)
	}
	return &Bucket{kv: kv, js: js}, nil
}

// createWait bounds BindBucket's create of a missing bucket before it
// looks whether the bucket exists after all.
const createWait = 3 * time.Second

// BindBucket returns the [BucketName] bucket as it is, and creates it as
// [OpenBucket] does only if it does not exist: a replica that may yet
// refuse to start (a setting differs from a live replica's,
// [Membership.Start]) changes nothing of it. It returns an error if the
// bucket cannot be read or created.
func BindBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Bucket, error) {
	// Replicas started together look the bucket up and create it at once,
	// and requests sent at once to a cluster while it creates a stream may
	// go unanswered though they take effect (nats-server v2.15.2; a look-up
	// went unanswered for 10 s in CI under -race): each request gets
	// createWait, and one left unanswered is followed by a new look.
	for {
		lctx, cancel := context.WithTimeout(ctx, createWait)
		kv, err := js.KeyValue(lctx, BucketName)
		cancel()
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			cctx, cancel := context.WithTimeout(ctx, createWait)
			var b *Bucket
			b, err = OpenBucket(cctx, js, cfg)
			cancel()
			if err == nil {
				return b, nil
			}
		}
		switch {
		case err == nil:
			return &Bucket{kv: kv, js: js}, nil
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			continue // unanswered: look again
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return nil, fmt.Errorf("lease: bucket %s: %w", BucketName, cmpErr(ctx.Err(), err))
		default:
			return nil, fmt.Errorf("lease: bucket %s: %w", BucketName, err)
		}
	}
}

// Entry is one lease key's stored state, for observability (delayctl
// stats, /metrics): who holds what, at which epoch. It says nothing about
// whether the holder is still valid: only the holder can tell.
type Entry struct {
	// Key is the lease's key, e.g. "level.DELAYD_5S".
	Key string
	// Value is the decoded value; zero if Err is set.
	Value Value
	// Revision is the key's KV revision.
	Revision uint64
	// Err wraps [ErrCorrupt] when the stored value does not decode.
	Err error
}

// Leases returns every lease key's entry, sorted by key; keys deleted or
// purged by hand, and membership keys ([MemberKeyPrefix]), are left out. It returns an error if the bucket cannot be
// read.
func (b *Bucket) Leases(ctx context.Context) ([]Entry, error) {
	w, err := b.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("lease: list %s: %w", BucketName, err)
	}
	defer func() { _ = w.Stop() }()
	latest := make(map[string]jetstream.KeyValueEntry)
	for e := range w.Updates() {
		if e == nil {
			break // the current values are all delivered
		}
		if strings.HasPrefix(e.Key(), MemberKeyPrefix) {
			continue // a membership key, not a lease
		}
		latest[e.Key()] = e // a key written while listing comes again, newer
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("lease: list %s: %w", BucketName, err)
	}
	out := make([]Entry, 0, len(latest))
	for k, e := range latest {
		v, derr := DecodeValue(e.Value())
		out = append(out, Entry{Key: k, Value: v, Revision: e.Revision(), Err: derr})
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Value is a lease key's value: who holds it, at which epoch. Encoded as
// JSON {"v":1,"holder":"...","epoch":N}; an empty Holder means released.
type Value struct {
	// Version is the encoding's version, [ValueVersion].
	Version int `json:"v"`
	// Holder is the holding replica's id ([NewHolderID]); empty when the
	// lease was released.
	Holder string `json:"holder"`
	// Epoch is the holder's term number, 1 for the first holder. It
	// increases on every change of holder and stays the same across
	// renewals and the release.
	Epoch uint64 `json:"epoch"`
}

// DecodeValue decodes a lease value. It returns an error wrapping
// [ErrCorrupt] for anything but a JSON object of a known version.
func DecodeValue(b []byte) (Value, error) {
	var v Value
	if err := json.Unmarshal(b, &v); err != nil {
		return Value{}, fmt.Errorf("%w: %q: %w", ErrCorrupt, b, err)
	}
	if v.Version != ValueVersion {
		return Value{}, fmt.Errorf("%w: %q: version %d, want %d", ErrCorrupt, b, v.Version, ValueVersion)
	}
	return v, nil
}

func (v Value) encode() []byte {
	v.Version = ValueVersion
	b, _ := json.Marshal(v) // a struct of a string and numbers always marshals
	return b
}

// NewHolderID returns a holder id unique to this process's life:
// "<hostname>-<pid>-<8 random hex digits>", e.g. "web-1-4242-9f2c01ab"
// (a hostname's characters other than letters, digits, - and _ become _). A
// restarted process gets a new id, so it never mistakes its previous life's
// lease for its own.
func NewHolderID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "delayd"
	}
	// The id is also a key token ([MemberKey]): other characters become _.
	host = strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			return c
		}
		return '_'
	}, strings.Trim(host, "."))
	var r [4]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:]))
}

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

	// Gate, if set, is asked before every write that would take the
	// lease (see [Gate]): a replica that balances its leases with others
	// bids only while it is below its share. Optional. Default: always bid.
	Gate Gate

	// Logger receives failed renewals and losses. Optional. Default
	// discards.
	Logger *slog.Logger
}

// Gate decides whether this replica bids for a lease that is free to
// take now: released, never written, or (held by another) unchanged for
// the TTL.
type Gate interface {
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
type Lease struct {
	kv     jetstream.KeyValue
	key    string
	holder string
	ttl    time.Duration
	margin time.Duration
	logger *slog.Logger

	gate Gate
	wake chan struct{} // Wake: Acquire tries again at once

	pauseRenewals atomic.Bool   // tests: simulate a paused holder
	watchReady    chan struct{} // tests: if set, a watch waits for it before it is created

	mu sync.Mutex
	// The revision last seen in a Get (0: the key was never written), and
	// when (after its response) it was first seen: a contender takes over
	// a held key only T after seenAt. seen is false until a Get and after
	// a term began.
	seen       bool
	seenWait   bool // the key seen is held by another (or unreadable): taken only T after seenAt
	seenRev    uint64
	seenAt     time.Time
	seenHolder string // the holder the last Get showed; "" if released or unreadable
	term       *term  // nil while not held; ended terms are replaced, not reused
}

// term is one holding of the lease, from acquisition to its end.
type term struct {
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
	return &Lease{kv: b.kv, key: cfg.Key, holder: cfg.Holder, ttl: cfg.TTL, margin: cfg.Margin, gate: cfg.Gate,
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
	t := l.term
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
	if t := l.term; t != nil && !t.ended {
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
	if t := l.term; t != nil && !t.ended {
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
	t := l.term
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

// TryAcquire makes one attempt to take the lease and reports whether this
// replica now holds it. It returns true at once if a term is already held.
// Otherwise it reads the key: it creates a key never written and takes a
// released one, or one still naming this Lease's own holder (its term ended
// and nobody wrote since), at once; a key naming another holder, deleted or purged by hand,
// or unreadable, it takes only once this Lease has seen the same revision
// for TTL (measured across calls from the first Get response that showed
// it). A value with an empty holder written by hand over a held lease is
// taken at once: don't. Losing a race to another contender returns false, nil. err
// is a failed read or write; an acquiring write whose outcome is unknown (a
// timeout) returns false and the error, and is safe: a lease written but
// not known as held is never renewed, so others take it after TTL.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	if _, valid := l.Held(); valid {
		return true, nil
	}
	var (
		epoch  uint64
		rev    uint64 // the revision to Update at; 0 means Create
		wait   bool   // take it only once rev was seen unchanged for TTL
		holder string // the holder the key names; "" if none or unreadable
	)
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Never written (create at once), or deleted or purged by hand
		// (its holder may still be valid: wait), with the marker's
		// revision deciding the epoch.
		marker, herr := l.lastMarker(ctx)
		if herr != nil {
			return false, herr
		}
		if marker == 0 {
			epoch = 1
		} else {
			epoch, rev, wait = marker+1, marker, true
		}
	case err != nil:
		return false, fmt.Errorf("lease %s: read: %w", l.key, err)
	default:
		rev = e.Revision()
		v, derr := DecodeValue(e.Value())
		switch {
		case derr != nil:
			l.logger.Warn("lease value unreadable; taking it over after its TTL", slog.Uint64("revision", rev), slog.Any("error", derr))
			epoch, wait = rev+1, true
		case v.Holder == "":
			epoch = v.Epoch + 1 // released: take it at once
		case v.Holder == l.holder:
			// This lease's own value: its term ended (expired while the
			// bucket did not answer its renewals, say while the bucket's
			// leader was elected) and nobody wrote the key since, or it
			// would name another holder. Take it back at once: the
			// compare-and-set at rev fails if a contender wrote first.
			epoch = v.Epoch + 1
		default:
			epoch, wait, holder = v.Epoch+1, true, v.Holder
		}
	}
	now := time.Now() // after the response that showed rev
	l.mu.Lock()
	if !l.seen || rev != l.seenRev {
		l.seen, l.seenRev, l.seenAt = true, rev, now
	}
	l.seenHolder, l.seenWait = holder, wait
	idle := now.Sub(l.seenAt)
	l.mu.Unlock()
	if wait {
		if idle < l.ttl {
			return false, nil
		}
		idle -= l.ttl
	}
	if l.gate != nil {
		done, ok := l.gate.Claim(l.key, idle)
		if !ok {
			return false, nil
		}
		defer done() // after begin: the claim turns into a held term
	}

	val := Value{Holder: l.holder, Epoch: epoch}.encode()
	sent := time.Now()
	var newRev uint64
	if rev == 0 {
		newRev, err = l.kv.Create(ctx, l.key, val)
	} else {
		newRev, err = l.kv.Update(ctx, l.key, val, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil // another contender was first
	}
	if err != nil {
		return false, fmt.Errorf("lease %s: acquire at revision %d: %w", l.key, rev, err)
	}
	l.begin(epoch, newRev, sent)
	return true, nil
}

// lastMarker returns the revision of the key's delete or purge marker, or
// 0 if the key was never written.
func (l *Lease) lastMarker(ctx context.Context) (uint64, error) {
	hist, err := l.kv.History(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("lease %s: read history: %w", l.key, err)
	}
	return hist[len(hist)-1].Revision(), nil
}

// begin starts a term whose acquiring write, sent at sent, stored rev.
func (l *Lease) begin(epoch, rev uint64, sent time.Time) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &term{epoch: epoch, acquired: time.Now(), ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), renewing: make(chan struct{}), rev: rev, fence: sent.Add(l.ttl - l.margin)}
	l.mu.Lock()
	l.term = t
	l.seen, l.seenWait, l.seenRev, l.seenAt, l.seenHolder = false, false, 0, time.Time{}, l.holder
	t.timer = time.AfterFunc(time.Until(t.fence), func() { l.expire(t) })
	l.mu.Unlock()
	l.logger.Debug("lease acquired", slog.Uint64("epoch", epoch), slog.Uint64("revision", rev))
	go l.renew(t)
}

// expire ends t if its fence has passed (a renewal may have moved it).
func (l *Lease) expire(t *term) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.ended {
		return
	}
	if d := time.Until(t.fence); d > 0 {
		t.timer.Reset(d)
		return
	}
	l.endLocked(t, fmt.Errorf("%w: epoch %d, no renewal stored for %s", ErrExpired, t.epoch, l.ttl-l.margin))
	l.logger.Warn("lease expired", slog.Uint64("epoch", t.epoch))
}

// endLocked ends t with cause. l.mu is held.
func (l *Lease) endLocked(t *term, cause error) {
	if t.ended {
		return
	}
	t.ended, t.endedAt = true, time.Now()
	t.timer.Stop()
	close(t.stop)
	t.cancel(cause)
}

// renew renews t every TTL/3 until it ends.
func (l *Lease) renew(t *term) {
	defer close(t.renewing)
	val := Value{Holder: l.holder, Epoch: t.epoch}.encode()
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		if l.pauseRenewals.Load() {
			continue
		}
		l.mu.Lock()
		if t.ended {
			// A renewal now would only make contenders wait T more.
			l.mu.Unlock()
			return
		}
		rev, fence := t.rev, t.fence
		l.mu.Unlock()
		// A renewal answered after the fence would still be valid (its
		// send time counts), but waiting longer than the fence for one
		// only delays noticing a loss.
		ctx, cancel := context.WithDeadline(context.Background(), fence)
		sent := time.Now()
		newRev, err := l.kv.Update(ctx, l.key, val, rev)
		cancel()
		l.mu.Lock()
		switch {
		case err == nil:
			t.rev = newRev
			if !t.ended {
				t.fence = sent.Add(l.ttl - l.margin)
			}
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			if !t.ended {
				l.logger.Warn("lease lost: another holder wrote it", slog.Uint64("epoch", t.epoch), slog.Uint64("revision", rev))
			}
			l.endLocked(t, fmt.Errorf("%w: epoch %d at revision %d: %w", ErrLost, t.epoch, rev, err))
		default:
			l.logger.Warn("lease renewal failed; retrying until its fence", slog.Uint64("epoch", t.epoch), slog.Any("error", err))
		}
		l.mu.Unlock()
	}
}

// Acquire waits until this replica holds the lease, trying at once, when
// the key changes (a release is taken at once), and when a holder's
// revision has been unchanged for TTL. It returns nil once held, ctx's
// error if ctx ends first. Failed reads and writes are logged and retried.
func (l *Lease) Acquire(ctx context.Context) error {
	if _, valid := l.Held(); valid {
		return nil
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	changed := make(chan struct{}, 1)
	go l.watch(wctx, changed)
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-l.wake:
		case <-wait.C:
		}
		actx, cancel := context.WithTimeout(ctx, l.ttl)
		held, err := l.TryAcquire(actx)
		cancel()
		if held {
			return nil
		}
		if err != nil && ctx.Err() == nil {
			l.logger.Warn("lease acquire failed; retrying", slog.Any("error", err))
		}
		// Wake when the seen revision will have been unchanged for TTL,
		// and at least every TTL/3 (a lost watch update, a new holder).
		next := l.ttl / 3
		l.mu.Lock()
		if l.seen && l.seenWait {
			if d := time.Until(l.seenAt.Add(l.ttl)); d < next {
				next = max(d, time.Millisecond)
			}
		}
		l.mu.Unlock()
		wait.Reset(next)
	}
}

// Wake makes a waiting [Lease.Acquire] try again at once, for example when
// its [Gate]'s answer may have changed (a replica left). It never blocks.
func (l *Lease) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Observed returns the holder named by the key at this Lease's last read
// ("" if released, never written or unreadable; this replica's id while
// it holds a term), and whether any read or term happened yet.
func (l *Lease) Observed() (holder string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != nil && !l.term.ended {
		return l.holder, true
	}
	return l.seenHolder, l.seen || l.term != nil
}

// Release ends the current term and hands the lease over: it stops
// renewing, waits for a renewal in flight, then writes an empty holder at
// the held revision with the same epoch, so a contender takes it at once.
// The term is no longer valid from the call on. Releasing without a term
// does nothing; releasing an ended term (expired, lost) still writes the
// empty holder, which fails harmlessly if another holder wrote since. It
// returns nil if the lease was released or was no longer this replica's (a
// compare-and-set failure: someone else holds it), ctx's error if a
// renewal in flight outlasted ctx, and the write's error otherwise (others
// then take the lease after TTL).
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	t := l.term
	if t == nil {
		l.mu.Unlock()
		return nil
	}
	l.endLocked(t, fmt.Errorf("%w: epoch %d", ErrReleased, t.epoch))
	l.mu.Unlock()
	select {
	case <-t.renewing:
	case <-ctx.Done():
		return fmt.Errorf("lease %s: release: %w", l.key, ctx.Err())
	}
	l.mu.Lock()
	rev := t.rev
	l.mu.Unlock()
	_, err := l.kv.Update(ctx, l.key, Value{Holder: "", Epoch: t.epoch}.encode(), rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("lease %s: release epoch %d at revision %d: %w", l.key, t.epoch, rev, err)
	}
	l.logger.Debug("lease released", slog.Uint64("epoch", t.epoch))
	return nil
}

// watch signals changed (without blocking) at every update of the key
// until ctx ends. Creating the watch needs a JetStream consumer, which can
// wait for a meta leader; it runs here so that Acquire polls meanwhile, and
// a watch that fails or ends leaves Acquire polling.
func (l *Lease) watch(ctx context.Context, changed chan<- struct{}) {
	if l.watchReady != nil {
		select {
		case <-l.watchReady:
		case <-ctx.Done():
			return
		}
	}
	w, err := l.kv.Watch(ctx, l.key, jetstream.UpdatesOnly())
	if err != nil {
		if ctx.Err() == nil {
			l.logger.Warn("lease watch failed; polling", slog.Any("error", err))
		}
		return
	}
	defer func() { _ = w.Stop() }()
	// The watch shows only updates from now on: one made after Acquire's
	// last read and before now (a release while the watch was created)
	// would wait for the next poll, TTL/3 later. Try once more now.
	select {
	case changed <- struct{}{}:
	default:
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	}
}
