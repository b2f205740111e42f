package level

import (
	"sync"
	"testing"
	"time"
)

// TestStartGraceHold: a core delivery is held only if it fell due before the
// start or last reconnect (by the server's clock) and the grace has not
// passed since (by the monotonic clock); a reconnect starts it again; no
// grace, or no start and no reconnect, holds nothing.
func TestStartGraceHold(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC) // the server's clock, estimated
	const grace = 5 * time.Second
	for _, tt := range []struct {
		name      string
		grace     time.Duration
		reconnect bool          // a reconnect at mono 1h
		elapsed   time.Duration // monotonic time since
		due       time.Time
		want      time.Duration
	}{
		{"no start, no reconnect", grace, false, 0, now.Add(-time.Hour), 0},
		{"no grace", 0, true, time.Second, now.Add(-time.Hour), 0},
		{"fell due before the reconnect", grace, true, 2 * time.Second, now.Add(-3 * time.Second), 3 * time.Second},
		{"fell due just at the reconnect", grace, true, 2 * time.Second, now.Add(-2 * time.Second), 0},
		{"fell due after the reconnect", grace, true, 2 * time.Second, now.Add(-time.Second), 0},
		{"not due yet", grace, true, 2 * time.Second, now.Add(time.Second), 0},
		{"grace passed", grace, true, grace, now.Add(-time.Hour), 0},
		{"grace all but passed", grace, true, grace - time.Nanosecond, now.Add(-time.Hour), time.Nanosecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lc := &manualClock{wall: now, mono: time.Hour}
			g := newStartGrace(lc, tt.grace, time.Time{})
			if tt.reconnect {
				g.reconnected()
			}
			lc.mono += tt.elapsed
			if got := g.hold(tt.due, now); got != tt.want {
				t.Errorf("hold = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStartGraceStart: a grace counted from a start a moment ago holds what
// was overdue at the start, for at most the grace; one counted from a start
// longer than the grace ago holds nothing.
func TestStartGraceStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	lc := &manualClock{wall: now, mono: time.Hour}
	g := newStartGrace(lc, 5*time.Second, time.Now())
	if got := g.hold(now.Add(-time.Minute), now); got <= 0 || got > 5*time.Second {
		t.Errorf("just started: hold = %v, want in (0, 5s]", got)
	}
	if got := g.hold(now.Add(time.Minute), now); got != 0 {
		t.Errorf("just started, not due: hold = %v, want 0", got)
	}
	old := newStartGrace(lc, 5*time.Second, time.Now().Add(-time.Minute))
	if got := old.hold(now.Add(-time.Hour), now); got != 0 {
		t.Errorf("started a minute ago: hold = %v, want 0", got)
	}
}

// TestStartGraceLook: the reconnect count is looked at no more than every
// reconnectLookEvery, and a change of it starts the grace again; a
// disconnect the scanner saw starts it at the next look, at once and even
// with the count unchanged (the count may lag the reconnect).
func TestStartGraceLook(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	overdue := now.Add(-time.Hour)
	const grace = 5 * time.Second
	type step struct {
		advance      time.Duration
		disconnected bool
		count        uint64 // the connection's reconnect count
		wantLooked   bool
		wantHeld     bool // the grace runs from this look
	}
	for _, tt := range []struct {
		name  string
		steps []step
	}{
		{"count unchanged", []step{{time.Second, false, 3, true, false}}},
		{"count changed", []step{{time.Second, false, 4, true, true}}},
		{"count changed, looked too soon", []step{
			{time.Second, false, 3, true, false},
			{reconnectLookEvery, false, 4, false, false},
			{time.Nanosecond, false, 4, true, true},
		}},
		{"disconnect seen, count unchanged", []step{
			{time.Second, false, 3, true, false},
			{time.Millisecond, true, 3, true, true},
			{time.Millisecond, false, 3, false, true},
		}},
		{"grace started once per reconnect", []step{
			{time.Second, false, 4, true, true},
			{grace, false, 4, true, false},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lc := &manualClock{wall: now, mono: time.Hour}
			g := newStartGrace(lc, grace, time.Time{})
			g.started(3)
			for i, st := range tt.steps {
				lc.mono += st.advance
				if st.disconnected {
					g.disconnected()
				}
				looked := false
				g.look(func() uint64 { looked = true; return st.count })
				if looked != st.wantLooked {
					t.Errorf("step %d: looked %v, want %v", i, looked, st.wantLooked)
				}
				if held := g.hold(overdue, now) > 0; held != st.wantHeld {
					t.Errorf("step %d: held %v, want %v", i, held, st.wantHeld)
				}
			}
		})
	}
}

// TestStartGraceReconnectedConcurrent: reconnected may be called from other
// goroutines while the scanner's goroutine asks hold (run with -race).
func TestStartGraceReconnectedConcurrent(t *testing.T) {
	t.Parallel()
	g := newStartGrace(SystemClock, time.Hour, time.Time{})
	now := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				g.reconnected()
			}
		}()
	}
	for range 1000 {
		g.hold(now.Add(-time.Hour), now)
	}
	wg.Wait()
	if got := g.hold(now.Add(-time.Hour), now); got <= 0 {
		t.Errorf("hold after reconnects = %v, want > 0", got)
	}
}
