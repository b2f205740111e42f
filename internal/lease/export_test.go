package lease

import "time"

// PauseRenewals makes the renew goroutine skip its renewals while on, as if
// the holder were paused.
func (l *Lease) PauseRenewals(on bool) { l.pauseRenewals.Store(on) }

// Margin returns the lease's margin.
func (l *Lease) Margin() time.Duration { return l.margin }
