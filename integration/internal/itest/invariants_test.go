package itest

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// failures is a testing.TB that records Errorf instead of failing.
type failures struct {
	testing.TB
	errs []string
}

func (f *failures) Helper() {}
func (f *failures) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// TestRecorderMoves feeds the recorder deliveries of moved messages and
// checks which CheckMoves refuses: an answered reschedule delivered at its
// old due or at both, an unanswered one at a third due or early, a lost run
// now outside its window.
func TestRecorderMoves(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	old, moved := t0.Add(time.Second), t0.Add(3*time.Second)
	type seen struct{ due, at time.Time }
	for _, tc := range []struct {
		name  string
		want  func(r *Recorder)
		got   []seen
		fails bool
	}{
		{"answered, delivered at the new due", func(r *Recorder) { r.Rescheduled("k", moved) }, []seen{{moved, moved}}, false},
		{"answered, delivered at the old due", func(r *Recorder) { r.Rescheduled("k", moved) }, []seen{{old, old}}, true},
		{"answered, delivered at both", func(r *Recorder) { r.Rescheduled("k", moved) }, []seen{{old, old}, {moved, moved}}, true},
		{"answered, new due but early", func(r *Recorder) { r.Rescheduled("k", moved) }, []seen{{moved, moved.Add(-time.Millisecond)}}, true},
		{"answered, a crash re-delivery of the new place", func(r *Recorder) { r.Rescheduled("k", moved) }, []seen{{moved, moved}, {moved, moved.Add(time.Second)}}, false},
		{"no answer, old due", func(r *Recorder) { r.MaybeRescheduled("k", old, moved) }, []seen{{old, old}}, false},
		{"no answer, new due", func(r *Recorder) { r.MaybeRescheduled("k", old, moved) }, []seen{{moved, moved}}, false},
		{"no answer, both", func(r *Recorder) { r.MaybeRescheduled("k", old, moved) }, []seen{{moved, moved}, {old, moved}}, true},
		{"no answer, a third due", func(r *Recorder) { r.MaybeRescheduled("k", old, moved) }, []seen{{t0, t0}}, true},
		{"no answer, early against the old due", func(r *Recorder) { r.MaybeRescheduled("k", old, moved) }, []seen{{old, t0}}, true},
		{"run now lost, in its window", func(r *Recorder) { r.MaybeRunNow("k", moved, t0, old) }, []seen{{t0.Add(time.Millisecond), old}}, false},
		{"run now lost, old due", func(r *Recorder) { r.MaybeRunNow("k", moved, t0, old) }, []seen{{moved, moved}}, false},
		{"run now lost, outside its window", func(r *Recorder) { r.MaybeRunNow("k", moved, t0, old) }, []seen{{old.Add(time.Millisecond), moved}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &failures{TB: t}
			r := NewRecorder(f)
			tc.want(r)
			for _, s := range tc.got {
				r.Record(&nats.Msg{Subject: "t", Data: []byte("k"), Header: nats.Header{contract.HeaderDueAt: {s.due.Format(time.RFC3339Nano)}}}, s.at)
			}
			if n := r.CheckMoves(); n != 1 {
				t.Errorf("CheckMoves saw %d moved keys delivered, want 1", n)
			}
			if got := len(f.errs) > 0; got != tc.fails {
				t.Errorf("CheckMoves failed %v (%q), want %v", got, f.errs, tc.fails)
			}
		})
	}
}
