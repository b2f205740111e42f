package lease

import "time"

// PauseRenewals makes the renew goroutine skip its renewals while on, as if
// the holder were paused.
func (l *Lease) PauseRenewals(on bool) { l.hooks.pauseRenewals.Store(on) }

// Margin returns the lease's margin.
func (l *Lease) Margin() time.Duration { return l.margin }

// HoldWatch makes the next watches wait until the returned function is
// called before they are created, as a slow consumer create would.
func (l *Lease) HoldWatch() (release func()) {
	ch := make(chan struct{})
	l.hooks.watchReady = ch
	return func() { close(ch) }
}

// HoldExpiry makes the expiry timer leave the term running past its fence
// while on, as a timer that fires late (a busy or paused process) would.
func (l *Lease) HoldExpiry(on bool) { l.hooks.holdExpiry.Store(on) }
