package level

import "time"

// mover.go: finishing a move whose intent is stored but whose new message
// is not known to be (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover).
// Built so far: the mover's decision for one intent. The mover itself (its
// own type, one goroutine per term, started and stopped by owner.run) is
// next (docs/pending.md#7-progress).

// moveAction is what the mover does with one moving intent.
type moveAction int

const (
	// moveRetry: whether the new message is stored is not known (the
	// router is behind, a read failed): look again later; the head stays
	// held.
	moveRetry moveAction = iota
	// movePlace: the new message is stored: write the placed mark, and
	// the old message is skipped (book.placed).
	movePlace
	// moveVoid: no new message, and the old one may have been handed off
	// before this term (by an owner that did not know the intent): delete
	// the intent and deliver the old one as usual (book.void).
	moveVoid
	// moveWrite: no new message, and nobody handed the old one off:
	// write it, then the placed mark.
	moveWrite
)

// moveFacts is what the mover knows of one moving intent when it decides.
type moveFacts struct {
	// exists and known are newExists' answer: known false when it could
	// not tell; exists true when the new message is stored.
	exists, known bool
	// seq is the moved sequence, oldDue the old message's level due
	// (message.LevelDue: when its level hands it off).
	seq    uint64
	oldDue time.Time
	// loadTail and loadedAt are the term's load's (owner.life): a
	// sequence at or below loadTail due by loadedAt (with a second's
	// slack, as completeCancel's check) may have been handed off before
	// the load by an owner whose offset commit was lost.
	loadTail uint64
	loadedAt time.Time
}

// action is §2.4's decision: a stored new message wins whatever the old
// due (the answer "rescheduled" may have been given); without one, the old
// message is voided only if it may have been handed off, and written again
// otherwise.
func (f moveFacts) action() moveAction {
	switch {
	case !f.known:
		return moveRetry
	case f.exists:
		return movePlace
	case f.seq <= f.loadTail && !f.oldDue.After(f.loadedAt.Add(time.Second)):
		return moveVoid
	}
	return moveWrite
}
