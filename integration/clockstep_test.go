package integration

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// wallClock is a [deliver.Clock] whose wall reading is off the machine's by
// an offset that a test steps, while its monotonic reading runs on, as on a
// machine whose clock is stepped. Its Now carries no monotonic reading, so
// every Sub between two of its readings sees a step (time.Now().Add would
// shift the monotonic reading too, and hide it).
type wallClock struct{ off atomic.Int64 }

func (c *wallClock) step(d time.Duration) { c.off.Add(int64(d)) }

func (c *wallClock) Now() time.Time {
	return time.Now().Add(time.Duration(c.off.Load())).Round(0)
}

func (c *wallClock) Mono() time.Duration { return deliver.SystemClock.Mono() }

// TestClockStep steps delayd's wall clock by +10 min, +30 s and -10 min while
// two levels hold messages, some published before the step and some after,
// to a stream target and to a core subject. By the server's clock (the
// target stream's store times; the embedded server shares this process's
// unstepped clock), none is delivered before its due (ingress store time +
// the level's delay), none 15 s or more after it (less than the smallest
// step, 30 s: not late by the step), and the scanners do not spin meanwhile (their loop count stays
// small).
func TestClockStep(t *testing.T) {
	t.Parallel()
	for _, step := range []time.Duration{10 * time.Minute, 30 * time.Second, -10 * time.Minute} {
		t.Run(fmt.Sprint(step), func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			b.CreateStream("STEP", "step.s.>")
			core := b.Collect("step.c.>")
			clock := &wallClock{}
			b.StartDelayd("1s 5s", func(c *deliver.Config) { c.Clock = clock })
			const n = 8 // per phase and target kind
			publish := func(phase string) {
				for i := range n {
					b.Publish("delay.step.s.x", []byte(phase+fmt.Sprint(i)), itest.Level(1+i%2))
					b.Publish("delay.step.c.x", []byte(phase+fmt.Sprint(i)), itest.Level(1+i%2))
				}
			}
			publish("before")
			itest.WaitFor(t, 10*time.Second, "first messages routed", func() bool {
				rs, _ := b.Svc.Stats()
				return rs.Routed >= 2*n
			})
			clock.step(step)
			publish("after")

			itest.WaitFor(t, 45*time.Second, "all delivered", func() bool {
				return b.StreamCount("STEP") >= 2*n && len(core.Snapshot()) >= 2*n
			})
			// Late by the step would be 30 s or more; 15 s leaves -race
			// and load their lateness and still catches it.
			const tooLate = 15 * time.Second
			var latest time.Duration
			for _, m := range b.StreamMsgs("STEP") {
				due := parseTime(t, m.Header, contract.HeaderDueAt)
				if m.Time.Before(due) {
					t.Errorf("stream delivery %s stored %s before its due, wall clock stepped %s", m.Data, due.Sub(m.Time), step)
				}
				latest = max(latest, m.Time.Sub(due))
				if late := m.Time.Sub(due); late > tooLate {
					t.Errorf("stream delivery %s stored %s after its due, wall clock stepped %s", m.Data, late, step)
				}
			}
			for _, r := range core.Snapshot() {
				due := parseTime(t, r.Msg.Header, contract.HeaderDueAt)
				if r.At.Before(due) {
					t.Errorf("core delivery %s received %s before its due, wall clock stepped %s", r.Msg.Data, due.Sub(r.At), step)
				}
				latest = max(latest, r.At.Sub(due))
				if late := r.At.Sub(due); late > tooLate {
					t.Errorf("core delivery %s received %s after its due, wall clock stepped %s", r.Msg.Data, late, step)
				}
			}
			t.Logf("wall clock stepped %s: max lateness %s", step, latest)
			// Each message costs a few loop iterations, and a waiting level
			// wakes every 10 s; a busy loop makes thousands a second.
			_, ss := b.Svc.Stats()
			var steps uint64
			for _, s := range ss {
				steps += s.Steps
				t.Logf("%s: %d steps, clock bound %s", s.Stream, s.Steps, s.ClockBound)
			}
			if limit := uint64(20*4*n + 100); steps > limit {
				t.Errorf("scanners looped %d times for %d messages (limit %d): a busy loop", steps, 4*n, limit)
			}
		})
	}
}

// TestCancelAfterRestartClockAhead restarts delayd with its wall clock
// 10 min ahead while a level holds a message due in 15 s: a cancel of it
// is decided by the server's clock, so it answers "cancelled" (not
// "already delivered", as a comparison with the local clock would), and
// the message is never delivered.
func TestCancelAfterRestartClockAhead(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	c := b.Collect("stepcancel.>")
	b.StartDelayd("1s 15s")
	id := fmt.Sprint(b.Publish("delay.stepcancel.x", []byte("x"), itest.Level(2)))
	due := time.Now().Add(15 * time.Second)
	itest.WaitFor(t, 10*time.Second, "message routed", func() bool {
		rs, _ := b.Svc.Stats()
		return rs.Routed >= 1
	})
	b.StopDelayd()
	clock := &wallClock{}
	clock.step(10 * time.Minute)
	b.StartDelayd("1s 15s", func(c *deliver.Config) { c.Clock = clock })
	if time.Now().After(due) {
		t.Fatalf("restart took longer than the level's delay: the cancel cannot be tested")
	}
	if r := b.Cancel(id); r != delayd.Cancelled {
		t.Fatalf("cancel %s after a restart with the wall clock 10 min ahead: %q, want %q", id, r, delayd.Cancelled)
	}
	itest.WaitFor(t, 30*time.Second, "the message's due passed", func() bool { return time.Now().After(due.Add(2 * time.Second)) })
	if got := c.Snapshot(); len(got) != 0 {
		t.Errorf("a cancelled message was delivered: %q", got[0].Msg.Data)
	}
}
