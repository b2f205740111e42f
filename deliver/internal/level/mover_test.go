package level

import (
	"testing"
	"time"
)

// TestMoverDecision: the mover's decision for one moving intent
// (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover,
// and the crash points of #25): a stored new message is placed whatever
// the old due; without one, the old message is voided (delivered as
// usual) when it may have been handed off before the load, and the new one
// written when nobody can have handed the old one off; an unknown answer
// decides nothing.
func TestMoverDecision(t *testing.T) {
	t.Parallel()
	loaded := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		f    moveFacts
		want moveAction
	}{
		{"not known", moveFacts{known: false, exists: true, seq: 5, oldDue: loaded, loadTail: 9, loadedAt: loaded}, moveRetry},
		{"stored, old due passed (crash after N: case 4, 5)", moveFacts{known: true, exists: true, seq: 5, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, movePlace},
		{"stored, old due ahead", moveFacts{known: true, exists: true, seq: 5, oldDue: loaded.Add(time.Hour), loadTail: 9, loadedAt: loaded}, movePlace},
		{"none, old due passed before the load (case 2, 3: old, late)", moveFacts{known: true, seq: 5, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveVoid},
		{"none, old due within the second's slack", moveFacts{known: true, seq: 5, oldDue: loaded.Add(time.Second), loadTail: 9, loadedAt: loaded}, moveVoid},
		{"none, old due after the slack (case 2, 3: new)", moveFacts{known: true, seq: 5, oldDue: loaded.Add(time.Second + time.Nanosecond), loadTail: 9, loadedAt: loaded}, moveWrite},
		{"none, stored after the load: nobody else saw it", moveFacts{known: true, seq: 10, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveWrite},
		{"none, the load's last sequence", moveFacts{known: true, seq: 9, oldDue: loaded.Add(-time.Hour), loadTail: 9, loadedAt: loaded}, moveVoid},
	}
	for _, tt := range tests {
		if got := tt.f.action(); got != tt.want {
			t.Errorf("%s: action %d, want %d", tt.name, got, tt.want)
		}
	}
}
