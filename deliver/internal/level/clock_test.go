package level

import (
	"testing"
	"time"
)

// manualClock is a Clock whose readings the test sets.
type manualClock struct {
	wall time.Time
	mono time.Duration
}

func (c *manualClock) Now() time.Time      { return c.wall }
func (c *manualClock) Mono() time.Duration { return c.mono }

// TestServerClock: the estimate follows monotonic time from the latest
// observation, less the allowed drift; a wall-clock step moves nothing; an
// older observation does not pull it back; a fresh one restarts it (a step
// back of the server's clock is followed); it goes stale after clockRefresh.
func TestServerClock(t *testing.T) {
	t.Parallel()
	server := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	lc := &manualClock{wall: server.Add(3 * time.Second), mono: time.Hour}
	c := &serverClock{clock: lc}
	if got := c.now(); !got.Equal(lc.wall) {
		t.Errorf("before any observation: %s, want the wall clock %s", got, lc.wall)
	}
	if !c.stale() {
		t.Error("not stale before any observation")
	}
	c.observe(server, true)
	lc.mono += 10 * time.Second
	lc.wall = lc.wall.Add(-10 * time.Minute) // a step back of the local wall clock
	want := server.Add(10*time.Second - 10*time.Second/(1_000_000/clockDriftPPM))
	if got := c.now(); !got.Equal(want) {
		t.Errorf("10 s after an observation: %s, want %s (10 s less 500 ppm)", got, want)
	}
	if got := c.upper(); !got.After(server.Add(10 * time.Second)) {
		t.Errorf("upper %s, want after %s", got, server.Add(10*time.Second))
	}
	if !c.stale() {
		t.Error("not stale clockRefresh after a fresh observation")
	}
	c.observe(server.Add(time.Second), false) // an older message: tells nothing new
	if got := c.now(); !got.Equal(want) {
		t.Errorf("after an older observation: %s, want %s", got, want)
	}
	c.observe(server.Add(11*time.Second), false) // the server's clock is ahead of the estimate
	if got := c.now(); !got.Equal(server.Add(11 * time.Second)) {
		t.Errorf("after a newer observation: %s, want %s", got, server.Add(11*time.Second))
	}
	back := server.Add(-time.Minute) // the server's clock stepped back
	c.observe(back, true)
	if got := c.now(); !got.Equal(back) {
		t.Errorf("after a fresh observation: %s, want %s", got, back)
	}
	if c.stale() {
		t.Error("stale right after a fresh observation")
	}
	if got := c.lead(); got != lc.wall.Sub(back) {
		t.Errorf("lead %s, want %s", got, lc.wall.Sub(back))
	}
}

// TestServerClockUncertain: a time past the estimate but within the drift
// allowance is uncertain once the observation is older than clockSharpen,
// so the scanner re-reads the server's clock instead of waiting out the
// allowance; a time beyond the allowance, or a young observation, is not.
func TestServerClockUncertain(t *testing.T) {
	t.Parallel()
	server := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)
	lc := &manualClock{wall: server, mono: time.Hour}
	c := &serverClock{clock: lc}
	c.observe(server, true)
	lc.mono += 10 * time.Second
	allowance := 10 * time.Second / (1_000_000 / clockDriftPPM) // 5 ms
	now := c.now()
	if !c.uncertain(now.Add(allowance)) {
		t.Errorf("%s past the estimate, within the allowance of a 10 s old observation: not uncertain", allowance)
	}
	if c.uncertain(now.Add(3 * allowance)) {
		t.Errorf("%s past the estimate: uncertain, want certainly not reached", 3*allowance)
	}
	c.observe(server.Add(10*time.Second), true)
	lc.mono += clockSharpen / 2
	if c.uncertain(c.now().Add(time.Microsecond)) {
		t.Error("uncertain with an observation younger than clockSharpen")
	}
}
