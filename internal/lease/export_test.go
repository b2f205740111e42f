package lease

import (
	"context"
	"time"
)

// PauseRenewals makes the renew goroutine skip its renewals while on, as if
// the holder were paused.
func (l *Lease) PauseRenewals(on bool) { l.pauseRenewals.Store(on) }

// TermInfo describes the last term, on this process's monotonic clock.
type TermInfo struct {
	Epoch      uint64
	Acquired   time.Time // the acquiring write was answered: validity began
	ValidUntil time.Time // min(fence, when the term ended); the fence if not ended
	Ended      bool
	Cause      error // nil while not ended
}

// LastTerm returns the last term's TermInfo; the zero TermInfo if none.
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

// Margin returns the lease's margin.
func (l *Lease) Margin() time.Duration { return l.margin }
