package itest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/offsets"
)

// Delivery is one message seen at a target.
type Delivery struct {
	target string    // the subject it arrived on
	id     string    // its Nats-Msg-Id
	Key    string    // the test's name for the message (its payload unless the recorder says otherwise)
	At     time.Time // the target stream's store time, or the core subscriber's receive time
	Due    time.Time // its Delay-Due-At; zero if missing or malformed
	level  string    // its Delay-Level header, if any
}

// Early reports whether d breaks "never early": it has no valid
// Delay-Due-At, or it was stored (stream-bound target) or received (core
// subscriber) before it.
func (d Delivery) Early() bool { return d.Due.IsZero() || d.At.Before(d.Due) }

// Recorder records the deliveries a test sees and checks the invariants of
// docs/guarantees.md#guarantees on them, one check per method:
//
//   - never early: every delivery is stored (stream-bound target) or received
//     (core subscriber) at or after its Delay-Due-At;
//   - nothing lost: every expected key is delivered, or the test excused it
//     (cancelled, dead-lettered);
//   - duplicates only where the contract allows: none at a stream-bound
//     target; at a core target only if the test says delayd crashed;
//   - nothing unexpected: no key the test did not expect, and no excused key
//     delivered.
//
// Receive times and store times are read on the test machine's clock, which
// is also the embedded server's.
type Recorder struct {
	t      testing.TB
	KeyOf  func(*nats.Msg) string
	mu     sync.Mutex
	got    []Delivery
	expect map[string]bool
	excuse map[string]string   // key -> why it need not arrive (and must not)
	moves  map[string]moveWant // key -> where a reschedule may have put it
}

// moveWant is what a reschedule of one key allows: answered, the new due
// only; not answered, the old due or the new one (or, for a run now whose
// answer was lost, a due in [from, to], the server's clock at the request).
type moveWant struct {
	answered bool
	old, new time.Time
	from, to time.Time
}

// NewRecorder returns a recorder that names each message by its payload.
func NewRecorder(t testing.TB) *Recorder {
	return &Recorder{t: t, KeyOf: func(m *nats.Msg) string { return string(m.Data) }, expect: map[string]bool{}, excuse: map[string]string{}, moves: map[string]moveWant{}}
}

// Record adds one delivery of m, seen at at.
func (r *Recorder) Record(m *nats.Msg, at time.Time) {
	d := Delivery{target: m.Subject, Key: r.KeyOf(m), At: at}
	if m.Header != nil {
		d.id = m.Header.Get(contract.HeaderNatsMsgID)
		d.level = m.Header.Get(contract.HeaderLevel)
		d.Due, _ = time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
	}
	r.mu.Lock()
	r.got = append(r.got, d)
	r.mu.Unlock()
}

// Subscribe records every message on a core subject, with its receive time.
func (r *Recorder) Subscribe(nc *nats.Conn, subject string) {
	r.t.Helper()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { r.Record(m, time.Now()) })
	if err != nil {
		r.t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// AddStream records every message of a target stream, with its store time.
func (r *Recorder) AddStream(msgs []*jetstream.RawStreamMsg) {
	for _, m := range msgs {
		r.Record(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, m.Time)
	}
}

// ExpectKeys says each key must be delivered (or excused).
func (r *Recorder) ExpectKeys(keys ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.expect[k] = true
	}
}

// Excused says key need not be delivered, and must not be, because why
// (for example "cancelled").
func (r *Recorder) Excused(key, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.excuse[key] = why
}

// Rescheduled says key's reschedule was answered rescheduled with newDue
// (the answer's Delay-Due-At): every delivery of key must carry exactly
// that Delay-Due-At and be seen at or after it, never at its old due.
// CheckMoves checks it; a later call for key replaces an earlier one (the
// last move answered is the one that counts).
func (r *Recorder) Rescheduled(key string, newDue time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.moves[key] = moveWant{answered: true, new: newDue}
}

// MaybeRescheduled says a reschedule of key to newDue was sent and its
// answer never came (or said already delivered after such a request): key
// is delivered at one due, oldDue or newDue, and seen at or after it.
func (r *Recorder) MaybeRescheduled(key string, oldDue, newDue time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.moves[key] = moveWant{old: oldDue, new: newDue}
}

// MaybeRunNow is [Recorder.MaybeRescheduled] for a run now whose answer
// never came: its new due is the server's clock when delayd took the
// request, known here only to lie in [from, to] (the first request's send,
// the last answer's arrival).
func (r *Recorder) MaybeRunNow(key string, oldDue, from, to time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.moves[key] = moveWant{old: oldDue, from: from, to: to}
}

// CheckMoves fails for each key given to Rescheduled, MaybeRescheduled or
// MaybeRunNow whose deliveries carry more than one Delay-Due-At (delivered
// at both places), a due the reschedule does not allow, or are seen before
// their due. It does not count copies of one placement: a stream-bound
// target drops them (CheckNoDuplicates), a core subscriber may see crash
// re-deliveries, which the test bounds. Lost keys are CheckComplete's.
// It returns the number of keys moved that were delivered.
func (r *Recorder) CheckMoves() int {
	r.t.Helper()
	byKey := map[string][]Delivery{}
	for _, d := range r.Snapshot() {
		byKey[d.Key] = append(byKey[d.Key], d)
	}
	r.mu.Lock()
	moves := maps.Clone(r.moves)
	r.mu.Unlock()
	bad, seen := 0, 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 10 {
			r.t.Errorf(format, args...)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(moves)) {
		w, ds := moves[k], byKey[k]
		if len(ds) == 0 {
			continue
		}
		seen++
		due := ds[0].Due
		for _, d := range ds[1:] {
			if !d.Due.Equal(due) {
				fail("%s moved: delivered at two dues, %s and %s (both places)", k, due.Format(time.RFC3339Nano), d.Due.Format(time.RFC3339Nano))
				break
			}
		}
		allowed := due.Equal(w.new)
		switch {
		case w.answered:
		case !w.from.IsZero():
			allowed = due.Equal(w.old) || !due.Before(w.from) && !due.After(w.to)
		default:
			allowed = allowed || due.Equal(w.old)
		}
		if !allowed {
			switch {
			case w.answered:
				fail("%s answered rescheduled to %s: delivered with due %s", k, w.new.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
			default:
				fail("%s moved without an answer (old due %s, new %s, run now in [%s, %s]): delivered with due %s", k,
					w.old.Format(time.RFC3339Nano), w.new.Format(time.RFC3339Nano), w.from.Format(time.RFC3339Nano), w.to.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
			}
		}
		for _, d := range ds {
			if d.At.Before(d.Due) {
				fail("%s moved: seen %s before its due %s", k, d.Due.Sub(d.At), d.Due.Format(time.RFC3339Nano))
				break
			}
		}
	}
	if bad > 10 {
		r.t.Errorf("%d reschedule checks failed in all", bad)
	}
	return seen
}

// Snapshot returns a copy of the deliveries recorded so far.
func (r *Recorder) Snapshot() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// Counts returns the number of deliveries per key.
func (r *Recorder) Counts() map[string]int {
	n := map[string]int{}
	for _, d := range r.Snapshot() {
		n[d.Key]++
	}
	return n
}

// CheckNeverEarly fails for each delivery without a Delay-Due-At or seen
// before it. It returns the number of deliveries checked.
func (r *Recorder) CheckNeverEarly() int {
	r.t.Helper()
	got := r.Snapshot()
	bad := 0
	for _, d := range got {
		if !d.Early() {
			continue
		}
		switch {
		case d.Due.IsZero():
			bad++
			if bad <= 10 {
				r.t.Errorf("%s on %s: no valid %s", d.Key, d.target, contract.HeaderDueAt)
			}
		default:
			bad++
			if bad <= 10 {
				r.t.Errorf("%s on %s delivered %s early (due %s, seen %s)", d.Key, d.target, d.Due.Sub(d.At),
					d.Due.Format(time.RFC3339Nano), d.At.Format(time.RFC3339Nano))
			}
		}
	}
	if bad > 10 {
		r.t.Errorf("%d deliveries early or without a due time in all", bad)
	}
	return len(got)
}

// CheckComplete fails for each expected key neither delivered nor excused,
// each excused key delivered, and each delivered key not expected.
func (r *Recorder) CheckComplete() {
	r.t.Helper()
	n := r.Counts()
	r.mu.Lock()
	defer r.mu.Unlock()
	var lost, unexpected, excusedButDelivered []string
	for k := range r.expect {
		if _, ok := r.excuse[k]; !ok && n[k] == 0 {
			lost = append(lost, k)
		}
	}
	for k, c := range n {
		if why, ok := r.excuse[k]; ok {
			excusedButDelivered = append(excusedButDelivered, fmt.Sprintf("%s (%s, delivered %d)", k, why, c))
		} else if !r.expect[k] {
			unexpected = append(unexpected, k)
		}
	}
	for _, s := range []struct {
		what string
		keys []string
	}{{"lost", lost}, {"delivered but not expected", unexpected}, {"delivered though excused", excusedButDelivered}} {
		if len(s.keys) > 0 {
			slices.Sort(s.keys)
			r.t.Errorf("%d %s, e.g. %q", len(s.keys), s.what, s.keys[:min(len(s.keys), 10)])
		}
	}
}

// CheckNoDuplicates fails for each key delivered more than once. Use it at a
// stream-bound target, or at a core target when delayd did not crash.
func (r *Recorder) CheckNoDuplicates() {
	r.t.Helper()
	var dup []string
	for k, c := range r.Counts() {
		if c > 1 {
			dup = append(dup, fmt.Sprintf("%s×%d", k, c))
		}
	}
	if len(dup) > 0 {
		slices.Sort(dup)
		r.t.Errorf("%d keys delivered more than once, e.g. %q", len(dup), dup[:min(len(dup), 10)])
	}
}

// CheckAll runs every check: never early, complete, no duplicates, and
// the reschedules' (CheckMoves).
func (r *Recorder) CheckAll() {
	r.t.Helper()
	r.CheckNeverEarly()
	r.CheckComplete()
	r.CheckNoDuplicates()
	r.CheckMoves()
}

// OffsetWatch sees every value written to the offsets bucket
// (DELAYD_OFFSETS) while it runs, in revision order, and checks that each
// level's offset only moves forward. A deleted key (the level stream was
// deleted, or a test reset it) starts that key afresh. The bucket keeps one
// value per key, so a value overwritten before the watch reads it is not
// seen: a brief regression can slip by, a lasting one cannot.
type OffsetWatch struct {
	t       *testing.T
	mu      sync.Mutex
	last    map[string]uint64
	updates int
	back    []string
	stop    func()
	done    chan struct{}
}

// WatchOffsets starts an OffsetWatch on js; it stops at cleanup or by check.
// The bucket must exist (delayd started once).
func WatchOffsets(t *testing.T, js jetstream.JetStream) *OffsetWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	o := &OffsetWatch{t: t, last: map[string]uint64{}, done: make(chan struct{})}
	o.stop = func() { _ = w.Stop(); cancel() }
	go func() {
		defer close(o.done)
		for e := range w.Updates() {
			if e == nil {
				continue // the end of the initial values
			}
			o.mu.Lock()
			o.updates++
			if e.Operation() != jetstream.KeyValuePut {
				delete(o.last, e.Key())
				o.mu.Unlock()
				continue
			}
			v, err := strconv.ParseUint(string(e.Value()), 10, 64)
			if err == nil {
				if prev, ok := o.last[e.Key()]; ok && v < prev {
					o.back = append(o.back, fmt.Sprintf("%s: %d after %d (revision %d)", e.Key(), v, prev, e.Revision()))
				}
				o.last[e.Key()] = v
			}
			o.mu.Unlock()
		}
	}()
	t.Cleanup(o.stop)
	return o
}

// Check stops the watch and fails if an offset moved back. It returns the
// number of updates seen.
func (o *OffsetWatch) Check() int {
	o.t.Helper()
	o.stop()
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
		o.t.Error("offset watch did not stop")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.back) > 0 {
		o.t.Errorf("offsets moved back %d times, e.g. %q", len(o.back), o.back[:min(len(o.back), 10)])
	}
	return o.updates
}

// WaitQuiet waits until what() stops changing for quiet, with a deadline.
// It stands for "any late arrival would show now": quiet is time that must
// pass for an absence to mean something, not a wait for an event.
func WaitQuiet(t *testing.T, quiet, timeout time.Duration, what func() int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last, since := what(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("still changing after %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
		if n := what(); n != last {
			last, since = n, time.Now()
		}
	}
}
