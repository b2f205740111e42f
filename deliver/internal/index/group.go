package index

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
)

// Group packs the records of consecutive placements into one message per
// slot subject, writes them together, and tells when they are stored.
//
// Two parties use it. Its writer, one goroutine, calls [Group.Add] and then
// [Group.Flush] once. Any goroutine may call [Group.Stored], which first
// waits for Flush. So a goroutine waiting in Stored must never be one the
// writer waits for before it flushes, or the two wait on each other for
// ever. deliver's write pipeline rules that out by its structure: its
// acker fills and flushes each group before it hands it to the confirmer,
// which waits in Stored.
//
// Only [Stream]'s leader answers a write, and a leader that hangs never
// does: a slot's message not answered within [jswire.WriteAttempt] is sent
// again, the same bytes, until one copy is answered or [jswire.OpTimeout]
// has passed since the first (docs/design.md#re-sent-writes-to-a-hung-leader).
// A copy stored besides another holds the same records: a lookup takes the
// latest record for a key, which is the same.
type Group struct {
	slots   map[string][]byte // slot subject -> packed records
	js      jetstream.JetStream
	writes  []*slotWrite
	err     error
	flushed chan struct{} // closed once the writes are started
	wait    sync.Once

	attempt, bound time.Duration // one copy's wait; the whole write's (jswire.WriteAttempt, jswire.OpTimeout)
	lose           func() bool   // fault tests: the copy is sent without a reply subject (LoseAnswers)
}

// slotWrite is one slot's message and the answers to its copies.
type slotWrite struct {
	msg     *nats.Msg
	first   time.Time  // the first copy was sent
	last    time.Time  // the latest copy was sent
	copies  int        // copies sent
	waiting int        // copies whose answer is not in
	answers chan error // each answered copy's outcome: nil (stored) or its error
}

// NewGroup returns an empty, open group.
func NewGroup() *Group {
	return &Group{
		slots: make(map[string][]byte), flushed: make(chan struct{}),
		attempt: jswire.WriteAttempt, bound: jswire.OpTimeout,
	}
}

// LoseAnswers makes each copy of the group's writes for which lose returns
// true go out without a reply subject: the server stores it and its PubAck
// is lost. For fault tests; call it before [Group.Flush]. lose runs on the
// goroutines that send copies.
func (g *Group) LoseAnswers(lose func() bool) { g.lose = lose }

// Add packs rec into the message of its key's slot. Writer only, before
// Flush.
func (g *Group) Add(rec Record) {
	subj := Subject(rec.Key)
	g.slots[subj] = rec.AppendTo(g.slots[subj])
}

// Flush starts the group's writes, one asynchronous publish per slot
// subject that has records, and releases [Group.Stored]. Writer only,
// once. A publish that cannot be started is remembered as the group's
// failure.
func (g *Group) Flush(js jetstream.JetStream) {
	g.js = js
	for subj, data := range g.slots {
		w := &slotWrite{msg: &nats.Msg{Subject: subj, Data: data}, answers: make(chan error, g.maxCopies())}
		if err := g.send(w); err != nil {
			g.err = err
			continue
		}
		w.first = w.last
		g.writes = append(g.writes, w)
	}
	g.slots = nil
	close(g.flushed)
}

// maxCopies is how many copies one slot's message is sent in at most.
func (g *Group) maxCopies() int { return int(g.bound/g.attempt) + 1 }

// send sends a copy of w's message.
func (g *Group) send(w *slotWrite) error {
	if g.lose != nil && g.lose() {
		if err := g.js.Conn().PublishMsg(w.msg); err != nil {
			return err
		}
	} else {
		fut, err := g.js.PublishMsgAsync(w.msg)
		if err != nil {
			return err
		}
		go func() { // ends when the copy is answered or times out (the publish-async timeout)
			select {
			case <-fut.Ok():
				w.answers <- nil
			case err := <-fut.Err():
				w.answers <- err
			}
		}()
	}
	w.copies++
	w.waiting++
	w.last = time.Now()
	return nil
}

// Stored waits until [Group.Flush] has been called and every write it
// started has its PubAck or its error; it returns the first failure, nil
// if every record is stored. A write no copy of which was answered within
// [jswire.OpTimeout] fails with [jetstream.ErrAsyncPublishTimeout] (its
// records may be stored). It waits for ever on a group never flushed.
// Safe to call from several goroutines and more than once: later calls
// return the same result.
func (g *Group) Stored() error {
	<-g.flushed
	g.wait.Do(func() {
		for _, w := range g.writes {
			if err := g.confirm(w); err != nil && g.err == nil {
				g.err = err
			}
		}
		g.writes = nil
	})
	return g.err
}

// confirm waits for one copy of w to be answered, sending another every
// attempt while none is, until bound has passed since the first. A copy
// refused by the server (or with no responders) is w's outcome; a copy
// that timed out, or was pending when the connection reconnected, is no
// answer.
func (g *Group) confirm(w *slotWrite) error {
	var last error = jetstream.ErrAsyncPublishTimeout
	// From w's latest copy: a write waited for after another (the same
	// hung leader had both) is sent again at once.
	timer := time.NewTimer(max(0, g.attempt-time.Since(w.last)))
	defer timer.Stop()
	// answered takes a copy's outcome: done when it is w's.
	answered := func(err error) bool {
		w.waiting--
		if err == nil || !unanswered(err) {
			last = err
			return true
		}
		last = err
		// Done when no copy is out and no other will be sent.
		return w.waiting == 0 && time.Since(w.first) >= g.bound
	}
	for {
		select {
		case err := <-w.answers:
			if answered(err) {
				return last
			}
		case <-timer.C:
			select {
			case err := <-w.answers: // an answer in already is taken before another copy is sent
				if answered(err) {
					return last
				}
				timer.Reset(max(0, g.attempt-time.Since(w.last)))
				continue
			default:
			}
			if time.Since(w.first) >= g.bound || w.copies >= g.maxCopies() {
				return last
			}
			if err := g.send(w); err != nil {
				return err
			}
			timer.Reset(g.attempt)
		}
	}
}

// unanswered reports whether err says a copy got no answer (it may be
// stored), as opposed to an answer: the server's refusal, or no stream
// listening on the subject (no responders: [Stream] is gone, not hung).
func unanswered(err error) bool {
	return errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrDisconnected)
}
