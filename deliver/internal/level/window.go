package level

import "github.com/delayd/delayd/deliver/internal/jswire"

// delivery is one hand-off awaiting confirmation.
type delivery struct {
	seq    uint64
	target string
	fut    *jswire.PubAckFuture // the PubAck's; nil for a core subject

	confirmed bool // nothing to wait for: dead-lettered, or confirmed earlier
	hop       bool // a cascading message moved on, not a delivery
}

// window is a scanner's confirmation window: the hand-offs in flight, in
// sequence order, and what became of those confirmed out of order after a
// failure. It is pure state: the scanner does the waiting (PubAck futures,
// the flush) and tells the window each outcome ([window.record]).
//
// Ownership: the scanner's goroutine alone; no locking. Cancel decisions
// read it there too ([Level.reserve]).
type window struct {
	size     int        // how many may be in flight before the scanner confirms the oldest half
	inflight []delivery // sent, not yet confirmed, in sequence order

	// After a failure the scanner rewinds to the failed delivery and
	// probes: one delivery at a time until the target takes it.
	probing  bool
	attempts map[uint64]int      // failed attempts of a delivery, until it is handed off
	done     map[uint64]struct{} // confirmed after an earlier failure; skipped on re-read
	unsure   map[uint64]struct{} // failed behind an earlier failure, maybe stored at the target; sent again
}

func newWindow(size int) *window {
	return &window{
		size:     size,
		attempts: make(map[uint64]int),
		done:     make(map[uint64]struct{}),
		unsure:   make(map[uint64]struct{}),
	}
}

// reset empties the window: the scanner (re)starts from its offset.
func (w *window) reset() {
	w.inflight, w.probing = w.inflight[:0], false
	clear(w.done)
	clear(w.attempts)
	clear(w.unsure)
}

// add puts a sent hand-off in flight, after every earlier one.
func (w *window) add(d delivery) { w.inflight = append(w.inflight, d) }

// passOver puts seq in flight as confirmed already (dead-lettered,
// cancelled, or confirmed before a failure): nothing to wait for, but the
// offset moves past it in order.
func (w *window) passOver(seq uint64) { w.add(delivery{seq: seq, confirmed: true}) }

// full reports whether the window holds size deliveries or more.
func (w *window) full() bool { return len(w.inflight) >= w.size }

// skipDone reports whether seq was confirmed after an earlier failure, and
// if so forgets it and passes over it: it is not sent again.
func (w *window) skipDone(seq uint64) bool {
	if _, ok := w.done[seq]; !ok {
		return false
	}
	delete(w.done, seq)
	w.passOver(seq)
	return true
}

// tried reports whether seq may have reached its target although the
// scanner's read position is before it: confirmed after a failure, failed
// ambiguously behind one, or tried and failed.
func (w *window) tried(seq uint64) bool {
	_, confirmed := w.done[seq]
	_, unsure := w.unsure[seq]
	return confirmed || unsure || w.attempts[seq] > 0
}

// failedAgain records one more failed attempt of seq and starts probing. It
// returns the attempts so far.
func (w *window) failedAgain(seq uint64) int {
	w.probing = true
	w.attempts[seq]++
	return w.attempts[seq]
}

// forgetAttempts drops seq's failed attempts: it is handed off otherwise
// (dead-lettered).
func (w *window) forgetAttempts(seq uint64) { delete(w.attempts, seq) }

// firstFailure reports whether one of the oldest n in-flight PubAcks has
// already failed, without waiting.
func (w *window) firstFailure(n int) bool {
	for _, d := range w.inflight[:n] {
		if d.fut == nil {
			continue
		}
		select {
		case <-d.fut.Done():
			if _, err := d.fut.Result(); err != nil {
				return true
			}
		default:
		}
	}
	return false
}

// outcome is what became of one confirmed delivery ([window.record]).
type outcome int

const (
	// outPassed: confirmed, as was every one before it: the offset moves
	// past it.
	outPassed outcome = iota
	// outFailed: the first failure of the pass; the scanner rewinds to it.
	outFailed
	// outUnsure: failed behind the first failure; sent again.
	outUnsure
	// outRemembered: confirmed behind the first failure; not sent again.
	outRemembered
	// outConfirmedBehind: confirmed already, behind the first failure:
	// nothing changes.
	outConfirmedBehind
)

// record takes the outcome of in-flight delivery d (err nil if
// confirmed), behindFailure telling whether an earlier delivery of the
// same pass failed.
func (w *window) record(d delivery, err error, behindFailure bool) outcome {
	switch {
	case err != nil && !behindFailure:
		return outFailed
	case err != nil:
		// The failure may be ambiguous (a PubAck timeout of a stored
		// write): a cancel must not count it as pending meanwhile.
		w.unsure[d.seq] = struct{}{}
		return outUnsure
	case !behindFailure:
		if !d.confirmed {
			delete(w.attempts, d.seq)
			if len(w.unsure) > 0 {
				delete(w.unsure, d.seq)
			}
		}
		return outPassed
	case !d.confirmed:
		w.done[d.seq] = struct{}{}
		return outRemembered
	}
	return outConfirmedBehind
}

// drop removes the oldest n deliveries, confirmed, keeping the rest in order.
func (w *window) drop(n int) {
	rest := copy(w.inflight, w.inflight[n:])
	clear(w.inflight[rest:])
	w.inflight = w.inflight[:rest]
}
