package level

import (
	"testing"
	"time"
)

// TestHeadDecide: one case per branch of the scanner's head decision (and of
// the step code it replaced): a cascading message waits for the end of its
// wait here, capped at clockRefresh, then moves on whatever its target
// facts; a due core delivery is held while disconnected, a not yet due one
// or a stream-bound one is not; a core delivery within the grace is held as
// a due head, capped, and a stream-bound one is not; a not yet due head
// waits, capped, and the wait is the longer of it and a grace; a head due
// now or before is delivered with its lateness.
func TestHeadDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC) // the server's clock, estimated
	const grace = 5 * time.Second
	for _, tt := range []struct {
		name string
		v    headView
		want headAction
	}{
		// Cascading messages.
		{"hop before the end of its wait",
			headView{due: now.Add(time.Hour), now: now, hop: true, hopDue: now.Add(3 * time.Second)},
			headAction{kind: headWait, wait: 3 * time.Second}},
		{"hop wait capped at clockRefresh",
			headView{due: now.Add(2 * time.Hour), now: now, hop: true, hopDue: now.Add(time.Hour)},
			headAction{kind: headWait, wait: clockRefresh}},
		{"hop at the end of its wait",
			headView{due: now.Add(time.Hour), now: now, hop: true, hopDue: now},
			headAction{kind: headForward, fellDue: now}},
		{"hop moves on, target facts ignored",
			headView{due: now.Add(-time.Second), now: now, hop: true, hopDue: now.Add(-2 * time.Second), disconnected: true, grace: grace},
			headAction{kind: headForward, fellDue: now.Add(-2 * time.Second)}},

		// The connection.
		{"due core delivery, disconnected",
			headView{due: now.Add(-time.Second), now: now, disconnected: true},
			headAction{kind: headHeldDisconnected, wait: heldDisconnectedWait, fellDue: now.Add(-time.Second)}},
		{"core delivery not due, disconnected",
			headView{due: now.Add(time.Second), now: now, disconnected: true},
			headAction{kind: headWait, wait: time.Second}},
		{"due stream-bound delivery, disconnected",
			headView{due: now.Add(-time.Second), now: now, bound: true, disconnected: true},
			headAction{kind: headDeliver, fellDue: now.Add(-time.Second), lateness: time.Second}},

		// The start or reconnect grace.
		{"due core delivery within the grace",
			headView{due: now.Add(-time.Minute), now: now, grace: grace},
			headAction{kind: headHeldStartGrace, wait: grace, fellDue: now.Add(-time.Minute)}},
		{"grace hold capped at clockRefresh",
			headView{due: now.Add(-time.Minute), now: now, grace: time.Hour},
			headAction{kind: headHeldStartGrace, wait: clockRefresh, fellDue: now.Add(-time.Minute)}},
		{"due stream-bound delivery, grace ignored",
			headView{due: now.Add(-time.Minute), now: now, bound: true, grace: grace},
			headAction{kind: headDeliver, fellDue: now.Add(-time.Minute), lateness: time.Minute}},
		{"not due, a grace outlasting the wait",
			headView{due: now.Add(time.Second), now: now, grace: grace},
			headAction{kind: headWait, wait: grace}},

		// Due or not.
		{"not due",
			headView{due: now.Add(time.Second), now: now},
			headAction{kind: headWait, wait: time.Second}},
		{"not due, wait capped at clockRefresh",
			headView{due: now.Add(time.Hour), now: now, bound: true},
			headAction{kind: headWait, wait: clockRefresh}},
		{"due just now",
			headView{due: now, now: now},
			headAction{kind: headDeliver, fellDue: now}},
		{"overdue core delivery",
			headView{due: now.Add(-2 * time.Second), now: now},
			headAction{kind: headDeliver, fellDue: now.Add(-2 * time.Second), lateness: 2 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.v.decide()
			if got.kind != tt.want.kind || got.wait != tt.want.wait || !got.fellDue.Equal(tt.want.fellDue) || got.lateness != tt.want.lateness {
				t.Errorf("decide = {%v wait %v fellDue %v lateness %v}, want {%v wait %v fellDue %v lateness %v}",
					got.kind, got.wait, got.fellDue, got.lateness, tt.want.kind, tt.want.wait, tt.want.fellDue, tt.want.lateness)
			}
			if idle := tt.want.kind == headWait; got.idle() != idle {
				t.Errorf("idle = %v, want %v: only a head not due leaves the level without a due head", got.idle(), idle)
			}
			if hand := tt.want.kind == headForward || tt.want.kind == headDeliver; got.handOff() != hand {
				t.Errorf("handOff = %v, want %v", got.handOff(), hand)
			}
		})
	}
}

// TestHeadViewWaitsFor: the scanner reads a fresh server clock for the time
// the head waits for: the end of a cascading message's wait here, else its
// due time.
func TestHeadViewWaitsFor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	if got := (headView{due: now.Add(time.Hour), hop: true, hopDue: now}).waitsFor(); !got.Equal(now) {
		t.Errorf("hop: waitsFor = %v, want its hopDue %v", got, now)
	}
	if got := (headView{due: now}).waitsFor(); !got.Equal(now) {
		t.Errorf("delivery: waitsFor = %v, want its due %v", got, now)
	}
}

// BenchmarkHeadDecide measures the head decision of a due core delivery
// (the hot path: every delivery passes it once). It allocates nothing.
func BenchmarkHeadDecide(b *testing.B) {
	now := time.Now()
	v := headView{due: now.Add(-time.Millisecond), now: now}
	b.ReportAllocs()
	for b.Loop() {
		if a := v.decide(); a.kind != headDeliver {
			b.Fatal(a.kind)
		}
	}
}
