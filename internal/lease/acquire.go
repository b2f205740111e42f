package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
// not known as held is never renewed, so others take it after TTL. A ctx
// cancelled while the write is in flight does not end the wait for its
// reply (ctx's deadline does): a lease so taken is released at once, and
// TryAcquire returns false and ctx's error.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	if _, valid := l.Held(); valid {
		return true, nil
	}
	epoch, rev, wait, holder, err := l.readKey(ctx)
	if err != nil {
		return false, err
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
	if l.claimer != nil {
		done, ok := l.claimer.Claim(l.key, idle)
		if !ok {
			return false, nil
		}
		defer done() // after begin: the claim turns into a held term
	}

	// The write, once sent, is waited for until ctx's deadline even if
	// ctx is cancelled meanwhile (a replica stopping as it takes its
	// leases): stored with its reply unread, it would keep every other
	// replica waiting one TTL. Stored for a caller gone, it is released.
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("lease %s: acquire at revision %d: %w", l.key, rev, err)
	}
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), cmp.Or(deadline(ctx), time.Now().Add(l.ttl)))
	defer cancel()
	val := Value{Holder: l.holder, Epoch: epoch}.encode()
	sent := time.Now()
	var newRev uint64
	if rev == 0 {
		newRev, err = l.kv.Create(wctx, l.key, val)
	} else {
		newRev, err = l.kv.Update(wctx, l.key, val, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil // another contender was first
	}
	if err != nil {
		return false, fmt.Errorf("lease %s: acquire at revision %d: %w", l.key, rev, err)
	}
	if ctx.Err() != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseWait)
		_, rerr := l.kv.Update(rctx, l.key, Value{Holder: "", Epoch: epoch}.encode(), newRev)
		rcancel()
		if rerr != nil {
			l.logger.Warn("lease taken as its caller gave up, not released; others take it after its TTL", slog.Uint64("epoch", epoch), slog.Any("error", rerr))
		}
		return false, fmt.Errorf("lease %s: acquire at revision %d: %w", l.key, rev, ctx.Err())
	}
	l.begin(epoch, newRev, sent)
	return true, nil
}

// readKey reads the lease key once and returns what TryAcquire writes:
// the epoch to take, the revision to Update at (0 means Create), whether
// to take it only once rev was seen unchanged for TTL, and the holder the
// key names ("" if none or unreadable). err is a failed read.
func (l *Lease) readKey(ctx context.Context) (epoch, rev uint64, wait bool, holder string, err error) {
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Never written (create at once), or deleted or purged by hand
		// (its holder may still be valid: wait), with the marker's
		// revision deciding the epoch.
		marker, herr := l.lastMarker(ctx)
		if herr != nil {
			return 0, 0, false, "", herr
		}
		if marker == 0 {
			epoch = 1
		} else {
			epoch, rev, wait = marker+1, marker, true
		}
	case err != nil:
		return 0, 0, false, "", fmt.Errorf("lease %s: read: %w", l.key, err)
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
	return epoch, rev, wait, holder, nil
}

// releaseWait bounds the release of a lease taken for a caller gone.
const releaseWait = 5 * time.Second

// deadline returns ctx's deadline, or the zero time if it has none.
func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
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
	t := &holding{epoch: epoch, acquired: time.Now(), ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), renewing: make(chan struct{}), rev: rev, fence: sent.Add(l.ttl - l.margin)}
	l.mu.Lock()
	l.holding = t
	l.seen, l.seenWait, l.seenRev, l.seenAt, l.seenHolder = false, false, 0, time.Time{}, l.holder
	t.timer = time.AfterFunc(time.Until(t.fence), func() { l.expire(t) })
	l.mu.Unlock()
	l.logger.Debug("lease acquired", slog.Uint64("epoch", epoch), slog.Uint64("revision", rev))
	go l.renew(t)
}

// acquireRetryMin is the least wait before [Lease.Acquire] tries again
// after a try that failed (a read or write error, not a lease held by
// another): without it, a try due at a holder's expiry that fails at once
// (a connection reconnecting with its buffer full, or closed, answers
// every request with an error in microseconds) would be retried every
// millisecond, a busy loop and a log line each (seen in CI:
// TestReplicasCutOff, 5,894 lines in 25 s while cut off). Capped at TTL/3
// for tiny test TTLs.
const acquireRetryMin = 50 * time.Millisecond

// acquireWarnEvery: of consecutive failed tries, the first and every
// acquireWarnEvery-th are logged at warn, the others at debug.
const acquireWarnEvery = 100

// Acquire waits until this replica holds the lease, trying at once, when
// the key changes (a release is taken at once), and when a holder's
// revision has been unchanged for TTL. It returns nil once held, ctx's
// error if ctx ends first. Failed reads and writes are logged and retried,
// at least [acquireRetryMin] apart.
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
	failures := 0 // consecutive failed tries
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
		if err == nil {
			failures = 0
		} else if ctx.Err() == nil {
			failures++
			level := slog.LevelDebug
			if failures == 1 || failures%acquireWarnEvery == 0 {
				level = slog.LevelWarn
			}
			l.logger.Log(ctx, level, "lease acquire failed; retrying", slog.Any("error", err), slog.Int("failures", failures))
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
		if err != nil {
			next = max(next, min(acquireRetryMin, l.ttl/3))
		}
		wait.Reset(next)
	}
}

// Wake makes a waiting [Lease.Acquire] try again at once, for example when
// its [Claimer]'s answer may have changed (a replica left). It never blocks.
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
	if l.holding != nil && !l.holding.ended {
		return l.holder, true
	}
	return l.seenHolder, l.seen || l.holding != nil
}

// watch signals changed (without blocking) at every update of the key
// until ctx ends. Creating the watch needs a JetStream consumer, which can
// wait for a meta leader; it runs here so that Acquire polls meanwhile, and
// a watch that fails or ends leaves Acquire polling.
func (l *Lease) watch(ctx context.Context, changed chan<- struct{}) {
	if l.hooks.watchReady != nil {
		select {
		case <-l.hooks.watchReady:
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
