package level

import (
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
)

// TestBookMoveStates walks the cancel book's move states
// (docs/pending.md#23-the-book-and-the-loop): reserved → moving
// (resolveMove) → moved (placed), or back to free (void); a moving entry
// never expires; of two tombstones of one sequence the newest is kept;
// intents and marks go to the janitor as moves. Each row starts from an
// empty book and ends in the state it names.
func TestBookMoveStates(t *testing.T) {
	t.Parallel()
	later := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	intent := func(seq, at uint64) index.Tombstone {
		return index.Tombstone{Seq: seq, Key: "u1", Target: "t.x", Move: later, At: at}
	}
	moving := func(b *cancelBook) *reservation {
		r := b.reserve(7, time.Now().Add(time.Minute))
		if !b.resolveMove(r, intent(7, 40)) {
			t.Fatal("resolveMove of an open reservation refused")
		}
		return r
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	tests := []struct {
		name string
		run  func(t *testing.T, b *cancelBook)
		want bookState
	}{
		{"reserved then resolved as a move is moving", func(t *testing.T, b *cancelBook) {
			r := moving(b)
			if !closed(r.done) {
				t.Error("the reservation's waiters were not released")
			}
			if ch := b.moving(7); ch == nil || closed(ch) {
				t.Error("moving(7): want an open channel")
			}
		}, stateMoving},
		{"expired moving entry is still held", func(t *testing.T, b *cancelBook) {
			r := moving(b)
			if b.expire(r) {
				t.Error("expire took a moving entry back")
			}
			b.release(r)
		}, stateMoving},
		{"placed is moved, its waiters released", func(t *testing.T, b *cancelBook) {
			moving(b)
			ch := b.moving(7)
			if !b.placed(7, 40, 41) {
				t.Fatal("placed refused its own intent")
			}
			if !closed(ch) || b.moving(7) != nil {
				t.Error("placed: the held head's channel not closed, or still moving")
			}
			if b.void(7, 40) {
				t.Error("void took back a placed move")
			}
		}, stateMoved},
		{"placed names another intent", func(t *testing.T, b *cancelBook) {
			moving(b)
			if b.placed(7, 39, 41) {
				t.Error("placed accepted another intent's mark")
			}
		}, stateMoving},
		{"void frees it", func(t *testing.T, b *cancelBook) {
			moving(b)
			ch := b.moving(7)
			if !b.void(7, 40) || !closed(ch) {
				t.Error("void refused, or the held head's channel not closed")
			}
		}, stateFree},
		{"resolveMove after the reservation expired", func(t *testing.T, b *cancelBook) {
			r := b.reserve(7, time.Now())
			b.expire(r)
			if b.resolveMove(r, intent(7, 40)) {
				t.Error("resolveMove of an expired reservation accepted")
			}
		}, stateFree},
		{"loaded intent is moving, found by its mark", func(t *testing.T, b *cancelBook) {
			b.load(intent(7, 40))
			if seq, ok := b.intentOf(40); !ok || seq != 7 {
				t.Errorf("intentOf(40) = %d, %v", seq, ok)
			}
			if _, ok := b.intentOf(41); ok {
				t.Error("intentOf(41): found")
			}
		}, stateMoving},
		{"newest tombstone wins: a cancel after an orphan intent", func(t *testing.T, b *cancelBook) {
			b.load(intent(7, 40))
			b.load(index.Tombstone{Seq: 7, Key: "u1", At: 45})
			b.load(intent(7, 30))
		}, stateCancelled},
		{"newest tombstone wins: an intent after an orphan cancel", func(t *testing.T, b *cancelBook) {
			b.load(intent(7, 50))
			b.load(index.Tombstone{Seq: 7, Key: "u1", At: 45})
		}, stateMoving},
		{"a cancel is cancelled", func(t *testing.T, b *cancelBook) {
			r := b.reserve(7, time.Now().Add(time.Minute))
			b.resolve(r, index.Tombstone{Seq: 7, Key: "u1", At: 40})
			if b.placed(7, 40, 41) || b.void(7, 40) || b.moving(7) != nil {
				t.Error("a cancel's tombstone taken as a move")
			}
		}, stateCancelled},
		{"moves go to the janitor as moves, with their marks", func(t *testing.T, b *cancelBook) {
			b.load(intent(7, 40))
			b.placed(7, 40, 41)
			b.load(intent(8, 42))
			b.load(index.Tombstone{Seq: 9, Key: "u9", At: 43})
			got := map[uint64]retiree{}
			b.drop(9, func(r retiree) bool { got[r.t.Seq] = r; return true })
			if r := got[7]; !r.move || r.markAt != 41 || r.t.At != 40 {
				t.Errorf("moved 7 retired as %+v", r)
			}
			if r := got[8]; !r.move || r.markAt != 0 {
				t.Errorf("moving 8 retired as %+v", r)
			}
			if r := got[9]; r.move {
				t.Errorf("cancelled 9 retired as %+v", r)
			}
			ch := b.moving(8)
			b.retired(8, true)
			b.retired(9, true)
			if !closed(ch) {
				t.Error("a retired moving entry's channel not closed")
			}
		}, stateMoved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newCancelBook()
			tt.run(t, b)
			if got, _, _ := b.state(7); got != tt.want {
				t.Errorf("state(7) = %d, want %d", got, tt.want)
			}
			if (tt.want != stateFree && tt.want != stateReserved) != b.cancelled(7) {
				t.Errorf("cancelled(7) = %v in state %d: a tombstone of any kind is not delivered here", b.cancelled(7), tt.want)
			}
		})
	}
}
