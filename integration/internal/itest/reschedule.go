package itest

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
)

// Move is one reschedule as a test saw it: sent, and sent again until it
// had a final answer (or a deadline passed).
type Move struct {
	Answer     delayd.RescheduleAnswer // the final answer; "" if none came
	Due        time.Time               // the answer's Delay-Due-At, for rescheduled
	Unanswered bool                    // an earlier request reached delayd (or may have) and got no final answer: it may have moved the message
	From, To   time.Time               // the first request's send, the final answer's arrival (or the deadline)
	Requested  time.Time               // the Delay-Deliver-At asked for; zero for a run now
}

// Reschedule moves id of target to requested (a run now if zero) with the
// Go client, sending again every 20 ms after an error or a 2 s timeout
// until a final answer (rescheduled, not found, already delivered) or
// until within has passed. A request refused for want of responders
// (delayd down) counts as not received.
func Reschedule(nc *nats.Conn, target, id string, requested time.Time, within time.Duration) Move {
	when := delayd.Now()
	if !requested.IsZero() {
		when = delayd.At(requested)
	}
	m := Move{From: time.Now(), Requested: requested}
	deadline := m.From.Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := delayd.Reschedule(ctx, nc, target, id, when)
		cancel()
		if err == nil {
			m.Answer, m.Due, m.To = r.Result, r.DueAt, time.Now()
			return m
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			m.Unanswered = true
		}
		if time.Now().After(deadline) {
			m.To = time.Now()
			return m
		}
		time.Sleep(20 * time.Millisecond) // delayd is down or failing over: pace the retries
	}
}

// Expect tells rec where key, whose old due was old, may be delivered
// after m, and returns m's kind for a test's log ("rescheduled",
// "unanswered, then already delivered", ...). ok is false for an answer a
// moved message cannot get (not found: the test saw its PubAck before).
//
//   - rescheduled: only at the answer's due (a move left unanswered before
//     it was moved again by the answered one);
//   - already delivered, nothing unanswered before: only at old;
//   - already delivered after an unanswered request, or no final answer:
//     at old or at the requested due, or, for a run now (or a deliver-at
//     passed by the time of the answer), in the requests' window.
func (m Move) Expect(rec *Recorder, key string, old time.Time) (kind string, ok bool) {
	kind = string(m.Answer)
	switch {
	case m.Answer == delayd.Rescheduled:
		rec.Rescheduled(key, m.Due)
		if m.Unanswered {
			kind = "unanswered, then " + kind
		}
	case m.Answer == delayd.RescheduleDelivered && !m.Unanswered:
		rec.Rescheduled(key, old) // its old place only: nothing moved it
	case m.Answer == delayd.RescheduleDelivered || m.Answer == "":
		if kind == "" {
			kind = "no final answer"
		}
		kind = "unanswered, then " + kind
		if m.Requested.IsZero() || m.Requested.Before(m.To) {
			rec.MaybeRunNow(key, old, m.From, m.To)
		} else {
			rec.MaybeRescheduled(key, old, m.Requested)
		}
	default:
		return kind, false
	}
	return kind, true
}
