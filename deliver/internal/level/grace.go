package level

import (
	"sync/atomic"
	"time"
)

// reconnectLookEvery is the least time between two looks at the
// connection's reconnect count by [startGrace.look].
const reconnectLookEvery = 50 * time.Millisecond

// startGrace is a scanner's start and reconnect grace: deliveries to core
// subjects that fell due before the start or the last reconnect (by the
// server's clock) are held until the grace has passed since (by the
// monotonic clock), so that core subscribers reconnect first. Messages that
// fall due later are not held; the scanner never asks for stream-bound
// targets.
//
// Ownership: the scanner's goroutine owns it and calls every method, except
// [startGrace.reconnected], which any goroutine may call
// (deliver.Service.HandleReconnect through [Level.Reconnected]): it writes only
// from, an atomic. seenReconnects, lookedAt and sawDisconnect are the
// scanner goroutine's alone.
type startGrace struct {
	clock Clock
	grace time.Duration // StartGrace; 0 or less holds nothing

	from atomic.Int64 // monotonic reading + 1 of the start or last reconnect; 0 if none

	seenReconnects uint64        // the connection's reconnect count at the last look
	lookedAt       time.Duration // monotonic reading of the last look
	sawDisconnect  bool          // a core delivery found the connection down
}

// newStartGrace returns a grace of length grace counted from startedAt (a
// local time.Now() reading: only the monotonic time elapsed since it
// counts). A zero startedAt holds nothing until a reconnect.
func newStartGrace(clock Clock, grace time.Duration, startedAt time.Time) *startGrace {
	g := &startGrace{clock: clock, grace: grace}
	if !startedAt.IsZero() {
		g.from.Store(int64(clock.Mono()-max(time.Since(startedAt), 0)) + 1)
	}
	return g
}

// reconnected starts the grace again from now, if there is a grace. Safe
// from any goroutine.
func (g *startGrace) reconnected() {
	if g.grace > 0 {
		g.from.Store(int64(g.clock.Mono()) + 1)
	}
}

// started records the connection's reconnect count when the scanner
// (re)starts, so that only reconnects after it start the grace.
func (g *startGrace) started(reconnects uint64) { g.seenReconnects = reconnects }

// disconnected records that a due core delivery found the connection
// down: the next look starts the grace once it is back.
func (g *startGrace) disconnected() { g.sawDisconnect = true }

// look starts the grace again for a reconnect the scanner saw happen
// (disconnected was called), or one that happened while it slept: a
// change of the reconnect count, read by reconnects, looked at no more
// than every reconnectLookEvery. It is called while connected, before a
// due core delivery.
func (g *startGrace) look(reconnects func() uint64) {
	if mono := g.clock.Mono(); g.sawDisconnect || mono-g.lookedAt > reconnectLookEvery {
		g.lookedAt = mono
		if r := reconnects(); r != g.seenReconnects || g.sawDisconnect {
			g.seenReconnects, g.sawDisconnect = r, false
			g.reconnected()
		}
	}
}

// hold returns how much longer a core delivery due at due (server time)
// waits, now being the server's clock, estimated: it fell due before the
// start or last reconnect, and the grace has not passed since (by the
// monotonic clock). 0 if it does not wait.
func (g *startGrace) hold(due, now time.Time) time.Duration {
	from := g.from.Load()
	if from == 0 || g.grace <= 0 {
		return 0
	}
	since := g.clock.Mono() - time.Duration(from-1)
	if since >= g.grace || !due.Before(now.Add(-since)) {
		return 0
	}
	return g.grace - since
}
