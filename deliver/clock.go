package deliver

import (
	"time"

	"github.com/delayd/delayd/deliver/internal/level"
)

// Clock is delayd's local time source. delayd never decides due-ness by the
// local wall clock: it estimates the server's clock from server timestamps
// plus the time elapsed since on [Clock.Mono], so a step of the local wall
// clock (suspend and resume, a first NTP sync, date -s) moves no decision.
// See docs/guarantees.md#never-early.
type Clock interface {
	// Now reads the local wall clock, which may step. delayd uses it only
	// before it has seen a server timestamp, and to report the local
	// clock's lead over the server's ([ScannerStats].ClockBound).
	Now() time.Time

	// Mono reads a monotonic clock: the time elapsed since a fixed,
	// arbitrary origin. It never steps. Every interval is measured on it.
	Mono() time.Duration
}

// SystemClock is the default [Clock]: Now is time.Now, Mono is Go's
// monotonic clock reading (time.Since uses it).
var SystemClock Clock = level.SystemClock
