package level

import (
	"cmp"
	"strconv"
	"time"
)

// heldDisconnectedWait is how long a due core delivery waits while the
// connection is down before the scanner looks at its head again.
const heldDisconnectedWait = 50 * time.Millisecond

// headView is what a scanner knows of its head when it decides what to do
// with it: [headView.decide] is the scanner's head state machine (wait for
// due, hold, move on, deliver), pure, so its rules read in one place and are
// tested without a server. The scanner gathers the view, with the I/O that
// takes (reading the server's clock, the connection's state), decides, and
// carries the [headAction] out (confirming, sleeping, publishing).
//
// Ownership: values on the scanner's goroutine; nothing is kept between
// heads. The state the view is read from belongs to the other parts:
// [serverClock], [startGrace], [target.Bindings].
//
// The scanner asks only what decide reads, in this order: the due time, the
// server's clock, the hop; for a message delivered from this level whether
// its target is stream-bound; for a due core delivery whether the
// connection is down (or else [startGrace.look]); for a core delivery not
// found disconnected the grace's hold. Facts not asked for a head are left
// zero, and decide does not read them.
type headView struct {
	due    time.Time // the delivery's due time, server time (Delay-Due-At)
	now    time.Time // the server's clock, estimated: a lower bound ([serverClock.now])
	hop    bool      // a cascading message: it moves on to its next level at hopDue
	hopDue time.Time // when a cascading message's wait at this level ends, server time

	bound        bool          // the target is stream-bound: confirmed by PubAck, never held. Not asked for a hop.
	disconnected bool          // the connection was down. Asked only for a due core delivery.
	grace        time.Duration // how much longer the start or reconnect grace holds a core delivery ([startGrace.hold]); 0 for none
}

// waitsFor returns the time the head waits for: the end of its wait at
// this level if it moves on, else its due time. The scanner reads a fresh
// server clock first when only the estimate's drift allowance keeps it
// from being reached ([serverClock.uncertain]).
func (v headView) waitsFor() time.Time { return cmp.Or(v.hopDue, v.due) }

// coreDue reports whether the head is a due delivery to a core subject,
// the one kind of head the connection and the reconnect count matter to.
func (v headView) coreDue() bool { return !v.hop && !v.bound && !v.due.After(v.now) }

// headKind is what a scanner does with its head.
type headKind uint8

const (
	// headWait: the head is not due (a cascading message not at the end
	// of its wait here). The scanner confirms what is in flight, marks the
	// level as holding no due head, and sleeps.
	headWait headKind = iota
	// headHeldDisconnected: a due core delivery while the connection is
	// down. nats.go would buffer it and send it the instant the connection
	// is back, before core subscribers have reconnected: the head stays
	// due (no progress) and is looked at again after heldDisconnectedWait.
	headHeldDisconnected
	// headHeldStartGrace: a due core delivery within the start or reconnect
	// grace. It stays a due head (reconnects are not progress) and waits
	// out the grace.
	headHeldStartGrace
	// headForward: a cascading message at the end of its wait here moves
	// on to its next level; moving on is its hand-off.
	headForward
	// headDeliver: a due delivery is published to its target.
	headDeliver
)

var headKindNames = [...]string{"wait", "held disconnected", "held for the grace", "forward", "deliver"}

func (k headKind) String() string {
	if int(k) < len(headKindNames) {
		return headKindNames[k]
	}
	return "headKind(" + strconv.Itoa(int(k)) + ")"
}

// headAction is a scanner's decision for its head: a value, so deciding
// allocates nothing.
type headAction struct {
	kind headKind
	// wait is how long to sleep before looking at the head again, at most
	// clockRefresh (so a step of the server's own clock is followed), for
	// headWait and the holds.
	wait time.Duration
	// fellDue is when the head fell due, server time: the due time, or the
	// end of a cascading message's wait here. The stall clock runs from the
	// first look at a due head ([Level.headFellDue]). Zero for headWait.
	fellDue time.Time
	// lateness is publish time - due by the server's clock, for
	// headDeliver.
	lateness time.Duration
}

// idle reports whether the level holds no due head while the scanner
// waits: only then does waiting count as progress for stall detection.
func (a headAction) idle() bool { return a.kind == headWait }

// handOff reports whether the head leaves the level now (forwarded or
// delivered), once a last look shows no cancel holds it.
func (a headAction) handOff() bool { return a.kind == headForward || a.kind == headDeliver }

// decide returns what to do with the head. The rules, in order:
//   - A cascading message waits until hopDue, then moves on; where it goes
//     is its next level's business, so no target fact counts.
//   - A due core delivery is held while the connection is down.
//   - A core delivery that fell due before the start or last reconnect waits
//     out the grace; held once due, so it stays a due head.
//   - Otherwise a head waits until its due time, then is delivered, late by
//     now - due.
//
// Every wait is at most clockRefresh. A head not decided here: one
// confirmed after an earlier failure ([window.skipDone]) or cancelled
// ([Level.skipCancelled]) is passed over before the view is gathered, by
// the part that owns the fact, in one call.
func (v headView) decide() headAction {
	if v.hop {
		if wait := v.hopDue.Sub(v.now); wait > 0 {
			return headAction{kind: headWait, wait: min(wait, clockRefresh)}
		}
		return headAction{kind: headForward, fellDue: v.hopDue}
	}
	if v.coreDue() && v.disconnected {
		return headAction{kind: headHeldDisconnected, wait: heldDisconnectedWait, fellDue: v.due}
	}
	wait := v.due.Sub(v.now)
	kind := headWait
	var fellDue time.Time
	if !v.bound && v.grace > 0 {
		if !v.due.After(v.now) {
			kind, fellDue = headHeldStartGrace, v.due
		}
		wait = max(wait, v.grace)
	}
	if wait > 0 {
		return headAction{kind: kind, wait: min(wait, clockRefresh), fellDue: fellDue}
	}
	return headAction{kind: headDeliver, fellDue: v.due, lateness: v.now.Sub(v.due)}
}
