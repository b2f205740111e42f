package level

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/jswire"
)

// TestWindowRecord: each outcome of a confirmed delivery changes the window's
// state as the confirmation rules say: a pass before any failure moves on
// and forgets the delivery's attempts and ambiguity; the first failure
// changes nothing (the scanner rewinds); behind it, a failure is unsure and
// a confirmation is remembered; a delivery confirmed already stays so.
func TestWindowRecord(t *testing.T) {
	t.Parallel()
	refused := errors.New("refused")
	for _, tt := range []struct {
		name          string
		d             delivery
		err           error
		behindFailure bool
		want          outcome
		wantDone      bool
		wantUnsure    bool
		wantAttempts  int
	}{
		{"confirmed", delivery{seq: 7}, nil, false, outPassed, false, false, 0},
		{"confirmed already", delivery{seq: 7, confirmed: true}, nil, false, outPassed, false, true, 2},
		{"first failure", delivery{seq: 7}, refused, false, outFailed, false, true, 2},
		{"failed behind a failure", delivery{seq: 7}, refused, true, outUnsure, false, true, 2},
		{"confirmed behind a failure", delivery{seq: 7}, nil, true, outRemembered, true, true, 2},
		{"confirmed already, behind a failure", delivery{seq: 7, confirmed: true}, nil, true, outConfirmedBehind, false, true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWindow(4)
			w.failedAgain(7)
			w.failedAgain(7)
			w.unsure[7] = struct{}{} // an earlier pass left it ambiguous
			if got := w.record(tt.d, tt.err, tt.behindFailure); got != tt.want {
				t.Errorf("outcome %d, want %d", got, tt.want)
			}
			_, done := w.done[7]
			_, unsure := w.unsure[7]
			if done != tt.wantDone || unsure != tt.wantUnsure || w.attempts[7] != tt.wantAttempts {
				t.Errorf("done %v unsure %v attempts %d; want %v %v %d", done, unsure, w.attempts[7], tt.wantDone, tt.wantUnsure, tt.wantAttempts)
			}
			if got, want := w.tried(7), tt.wantDone || tt.wantUnsure || tt.wantAttempts > 0; got != want {
				t.Errorf("tried = %v, want %v", got, want)
			}
		})
	}
}

// TestWindowLifecycle: deliveries stay in flight in order until dropped; the
// window is full at its size; a delivery remembered as confirmed is passed
// over once, as confirmed; failed attempts count up and start probing; a
// reset forgets everything.
func TestWindowLifecycle(t *testing.T) {
	t.Parallel()
	w := newWindow(3)
	seqs := func() []uint64 {
		var s []uint64
		for _, d := range w.inflight {
			s = append(s, d.seq)
		}
		return s
	}
	w.add(delivery{seq: 1})
	w.add(delivery{seq: 2})
	if w.full() {
		t.Error("full at 2 of 3")
	}
	w.passOver(3)
	if !w.full() {
		t.Error("not full at 3 of 3")
	}
	if d := w.inflight[2]; d.seq != 3 || !d.confirmed {
		t.Errorf("passed over: %+v, want seq 3 confirmed", d)
	}
	w.drop(2)
	if got := seqs(); !slices.Equal(got, []uint64{3}) {
		t.Errorf("after drop(2): %v, want [3]", got)
	}
	if n := w.failedAgain(4); n != 1 || !w.probing {
		t.Errorf("failedAgain: %d attempts, probing %v; want 1, true", n, w.probing)
	}
	if n := w.failedAgain(4); n != 2 {
		t.Errorf("failedAgain: %d attempts, want 2", n)
	}
	w.forgetAttempts(4)
	if w.tried(4) {
		t.Error("tried after its attempts were forgotten")
	}
	w.record(delivery{seq: 5}, nil, true) // remembered behind a failure
	if w.skipDone(6) {
		t.Error("skipDone(6): never confirmed")
	}
	if !w.skipDone(5) {
		t.Error("skipDone(5) = false, want true: confirmed after a failure")
	}
	if w.skipDone(5) {
		t.Error("skipDone(5) twice: it is forgotten once passed over")
	}
	if got := seqs(); !slices.Equal(got, []uint64{3, 5}) || !w.inflight[1].confirmed {
		t.Errorf("in flight %v (last confirmed %v), want [3 5] with 5 confirmed", got, w.inflight[1].confirmed)
	}
	w.failedAgain(8)
	w.record(delivery{seq: 9}, errors.New("x"), true)
	w.record(delivery{seq: 10}, nil, true)
	w.reset()
	if len(w.inflight) != 0 || w.probing || w.tried(8) || w.tried(9) || w.tried(10) {
		t.Errorf("after reset: %d in flight, probing %v, tried 8/9/10 %v %v %v; want none", len(w.inflight), w.probing, w.tried(8), w.tried(9), w.tried(10))
	}
}

// TestWindowFirstFailure: among the oldest n, a PubAck refused at once (a
// full stream, real server) is found without waiting, and again when asked
// again (confirmOldest reads the same future); one beyond n, and core deliveries,
// are not looked at.
func TestWindowFirstFailure(t *testing.T) {
	t.Parallel()
	_, o := confirmScanner(t)
	w := newWindow(8)
	w.add(delivery{seq: 1, target: "ok.x", fut: o.future("ok")})
	w.add(delivery{seq: 2, target: "core"})
	w.add(delivery{seq: 3, target: "full.x", fut: o.future("full")})
	// Wait, with a deadline, until the refusal has arrived.
	deadline := time.Now().Add(10 * time.Second)
	for !resolved(w.inflight[2].fut) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if w.firstFailure(2) {
		t.Error("firstFailure(2) = true: the failed PubAck is third")
	}
	if !w.firstFailure(3) {
		t.Fatal("firstFailure(3) = false, want true: the full stream refused 3")
	}
	if !w.firstFailure(3) {
		t.Error("firstFailure(3) = false the second time: the failure must stay visible to confirmOldest")
	}
	if _, err := w.inflight[2].fut.Result(); err == nil {
		t.Error("the full stream's refusal reads as stored")
	}
}

// resolved reports whether f's outcome is known.
func resolved(f *jswire.PubAckFuture) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}
