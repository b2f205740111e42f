package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// expiryHeldRetry is how often a held-back expiry timer (a test hook)
// looks again.
const expiryHeldRetry = 10 * time.Millisecond

// expire ends t if its fence has passed (a renewal may have moved it).
func (l *Lease) expire(t *holding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.ended {
		return
	}
	if d := time.Until(t.fence); d > 0 {
		t.timer.Reset(d)
		return
	}
	if l.hooks.holdExpiry.Load() {
		t.timer.Reset(expiryHeldRetry)
		return
	}
	l.endLocked(t, fmt.Errorf("%w: epoch %d, no renewal stored for %s", ErrExpired, t.epoch, l.ttl-l.margin))
	l.logger.Warn("lease expired", slog.Uint64("epoch", t.epoch))
}

// endLocked ends t with cause. l.mu is held.
func (l *Lease) endLocked(t *holding, cause error) {
	if t.ended {
		return
	}
	t.ended, t.endedAt = true, time.Now()
	t.timer.Stop()
	close(t.stop)
	t.cancel(cause)
}

// renew renews t every TTL/3 until it ends.
func (l *Lease) renew(t *holding) {
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
		if l.hooks.pauseRenewals.Load() {
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
	t := l.holding
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
