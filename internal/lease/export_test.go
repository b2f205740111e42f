package lease

import "time"

// PauseRenewals makes the renew goroutine skip its renewals while on, as if
// the holder were paused.
func (l *Lease) PauseRenewals(on bool) { l.pauseRenewals.Store(on) }

// Margin returns the lease's margin.
func (l *Lease) Margin() time.Duration { return l.margin }

// HoldWatch makes the next watches wait until the returned function is
// called before they are created, as a slow consumer create would.
func (l *Lease) HoldWatch() (release func()) {
	ch := make(chan struct{})
	l.watchReady = ch
	return func() { close(ch) }
}
