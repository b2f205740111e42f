package level

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
)

// Clock is delayd's local time source. delayd never decides due-ness by the
// local wall clock: it estimates the server's clock from server timestamps
// plus the time elapsed since on [Clock.Mono], so a step of the local wall
// clock (suspend and resume, a first NTP sync, date -s) moves no decision.
// See docs/guarantees.md#never-early.
type Clock interface {
	// Now reads the local wall clock, which may step. delayd uses it only
	// before it has seen a server timestamp, and to report the local
	// clock's lead over the server's ([Stats].ClockBound).
	Now() time.Time

	// Mono reads a monotonic clock: the time elapsed since a fixed,
	// arbitrary origin. It never steps. Every interval is measured on it.
	Mono() time.Duration
}

// SystemClock is the default [Clock]: Now is time.Now, Mono is Go's
// monotonic clock reading (time.Since uses it).
var SystemClock Clock = systemClock{}

type systemClock struct{}

var monoOrigin = time.Now()

func (systemClock) Now() time.Time      { return time.Now() }
func (systemClock) Mono() time.Duration { return time.Since(monoOrigin) }

const (
	// clockRefresh is how often a scanner restarts its estimate of the
	// server's clock from a fresh observation (a stream info), and so the
	// longest a scanner waits without looking at the server's clock. Over
	// it, a rate difference of 500 ppm between the local monotonic clock
	// and the server's clock makes 5 ms; the estimate allows for that much
	// (clockDriftPPM), so it is late by at most that, never early. It costs
	// one stream info per level every 10 s while the level holds messages.
	clockRefresh = 10 * time.Second

	// clockDriftPPM is the largest rate difference, in parts per million,
	// between the local monotonic clock and the server's clock that the
	// estimate allows for: 500 ppm is the most the Linux kernel slews a
	// clock; quartz oscillators differ by tens of ppm.
	clockDriftPPM = 500

	// clockSharpen: a head that would be due but for the drift allowance of
	// an observation older than this is decided on a fresh one instead, so
	// the allowance costs a long-waiting level at most this much times
	// clockDriftPPM (50 µs), not the 5 ms of a whole clockRefresh.
	clockSharpen = 100 * time.Millisecond
)

// serverClock estimates the server's clock as a lower bound: an
// observation of server time ts at local monotonic reading m proves the
// server's clock read at least ts at m, so at a later reading m' it reads
// at least ts + (m' - m), less the allowed drift. The estimate is the
// latest observation's, restarted from a fresh one every clockRefresh, so
// the drift stays small and a step of the server's own clock is followed
// (docs/guarantees.md#a-step-of-the-servers-clock). It is safe for concurrent use.
type serverClock struct {
	clock Clock

	mu    sync.Mutex
	ok    bool          // an observation was made
	at    time.Time     // the observed server time
	mono  time.Duration // the monotonic reading it was observed at
	fresh time.Duration // the monotonic reading of the last fresh restart
}

// observe tightens the estimate with server time ts, seen now (after the
// server read its clock). fresh restarts the estimate from ts, dropping
// earlier observations. A zero ts is ignored.
func (c *serverClock) observe(ts time.Time, fresh bool) {
	if ts.IsZero() {
		return
	}
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if fresh || !c.ok || ts.After(c.estimate(m)) {
		c.ok, c.at, c.mono = true, ts, m
	}
	if fresh {
		c.fresh = m
	}
}

func (c *serverClock) estimate(m time.Duration) time.Time {
	el := m - c.mono
	return c.at.Add(el - el/(1_000_000/clockDriftPPM))
}

// now returns the estimate of the server's clock: never ahead of it while
// the server's clock does not step back. Before any observation it is the
// local wall clock.
func (c *serverClock) now() time.Time {
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok {
		return c.clock.Now()
	}
	return c.estimate(m)
}

// postpone puts the next fresh restart a refresh interval off, after a
// failed one: the estimate only grows more conservative meanwhile.
func (c *serverClock) postpone() {
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fresh = m
}

// upper returns the estimate with the allowed drift added instead of
// taken off: for decisions where erring late is the unsafe side (a
// message counted as pending after its due).
func (c *serverClock) upper() time.Time {
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok {
		return c.clock.Now()
	}
	el := m - c.mono
	return c.at.Add(el + el/(1_000_000/clockDriftPPM))
}

// uncertain reports whether the server's clock may already have reached t
// although the estimate has not, only because of the drift allowed for since
// an observation more than clockSharpen old: a fresh observation would
// resolve it (see [Level] step).
func (c *serverClock) uncertain(t time.Time) bool {
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok || m-c.mono < clockSharpen {
		return false
	}
	el := m - c.mono
	return !t.After(c.at.Add(el + el/(1_000_000/clockDriftPPM)))
}

// stale reports whether the estimate is due a fresh restart.
func (c *serverClock) stale() bool {
	m := c.clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.ok || m-c.fresh >= clockRefresh
}

// lead returns how far the local wall clock is ahead of the estimate: an
// upper bound on its lead over the server's clock.
func (c *serverClock) lead() time.Duration { return c.clock.Now().Sub(c.now()) }

// observeClock tightens the estimate of the server's clock with a level
// message's sequence and store time, read just now. A later sequence stored
// at an earlier time shows the server's clock stepped back: the estimate
// restarts from a fresh stream info at once.
func (s *owner) observeClock(ctx context.Context, seq uint64, stored time.Time) {
	if stored.IsZero() {
		return
	}
	if seq > s.clock.obsSeq && stored.Before(s.clock.obsStored) {
		// (In a cluster, also a new stream leader whose clock is behind.)
		s.logger.Info("the server's clock stepped back; re-reading it", slog.Uint64("seq", seq), slog.Duration("step", stored.Sub(s.clock.obsStored)))
		s.clock.obsSeq, s.clock.obsStored = seq, stored
		s.refreshClock(ctx)
		return
	}
	s.clock.obsSeq, s.clock.obsStored = seq, stored
	if seq > s.clock.freshSeq {
		// Stored after the last fresh observation: a lower bound even if
		// the server's clock stepped before it.
		s.clock.srv.observe(stored, false)
	}
}

// refreshClock restarts the estimate of the server's clock from a fresh
// stream info. On failure the estimate stays (it only grows more
// conservative) and the next refresh is tried a refresh interval later.
func (s *owner) refreshClock(ctx context.Context) {
	ictx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	info, err := s.life.stream.Info(ictx)
	if err != nil || info.TimeStamp.IsZero() {
		s.clock.srv.postpone()
		return
	}
	s.freshFrom(info)
}

// freshFrom restarts the estimate from a stream info's server time.
func (s *owner) freshFrom(info *jetstream.StreamInfo) {
	if info.TimeStamp.IsZero() {
		return
	}
	s.clock.srv.observe(info.TimeStamp, true)
	s.clock.freshSeq = info.State.LastSeq
}
