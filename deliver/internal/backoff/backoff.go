// Package backoff holds delayd's one retry wait: capped exponential backoff
// with full jitter, used by every retry loop of the service.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is capped exponential backoff with full jitter.
type Backoff struct {
	min, max, cur time.Duration
}

// New returns a Backoff that starts at min and doubles up to max.
func New(min, max time.Duration) *Backoff { return &Backoff{min: min, max: max} }

// Next returns the next wait: a random duration in [cur/2, cur], cur doubling
// up to max.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

// Reset starts the next wait from min again.
func (b *Backoff) Reset() { b.cur = 0 }

// SetCur sets the current step: the next wait doubles from it (up to max).
func (b *Backoff) SetCur(d time.Duration) { b.cur = d }

// Max returns the cap.
func (b *Backoff) Max() time.Duration { return b.max }

// Sleep waits the next backoff; false if ctx ended first.
func (b *Backoff) Sleep(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
