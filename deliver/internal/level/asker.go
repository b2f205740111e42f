package level

import (
	"context"
	"errors"

	"github.com/delayd/delayd/deliver/internal/index"
)

// CancelAnswer is a scanner's decision on a cancel.
type CancelAnswer int

const (
	AnswerCancelled CancelAnswer = iota // pending: now never delivered
	AnswerDelivered                     // handed to its target already
	AnswerForwarded                     // moved on to its next level: look again
	AnswerGone                          // no such message at that sequence
	AnswerRetry                         // not stored yet: look again
	AnswerPending                       // a status request's: not handed off, not cancelled
)

// ErrNoOwner: no replica answered for the level as its owner (none holds
// its lease now, or the one that did is stopping or paused); the decision
// can be asked again.
var ErrNoOwner = errors.New("no owner answered")

// Asker asks the owner of a level stream, wherever it runs: this replica's
// owner for the current term, or another replica's over the level's decide
// subject (contract.DecideSubject). It is to be the only way into a level
// owner from another goroutine
// (docs/reshape.md#22-the-one-interface-for-other-goroutines).
type Asker interface {
	// Pending reports whether the message rec places is neither handed off
	// nor cancelled (a cancel in flight counts as pending; a hop forwarded
	// counts until its due, by the server's clock). No answer (no owner, a
	// failover, the wait for the owner passed) is false: a merge is missed,
	// a message is never merged into one delivered.
	Pending(ctx context.Context, rec index.Record) bool
	// Passed returns the highest sequence the owner of stream handed off;
	// 0 without an answer.
	Passed(ctx context.Context, stream string) uint64
	// Cancel decides a cancel of the message rec places: the owner
	// reserves the sequence between two deliveries, and the caller does
	// the I/O (read, tombstone, PubAck, fenced owner check). Asking again
	// is safe.
	Cancel(ctx context.Context, rec index.Record) (CancelAnswer, error)
}

// Owners is to be the one [Asker] every other package holds: by stream, it
// asks this replica's owner of the level when there is one, and the owner
// on another replica otherwise. It is not wired yet (step S2 of
// docs/reshape.md#6-steps-in-order): it knows no level, so it answers as
// when no owner answers: not pending, nothing passed, [ErrNoOwner].
type Owners struct{}

var _ Asker = (*Owners)(nil)

// Pending reports false: no owner answers.
func (*Owners) Pending(context.Context, index.Record) bool { return false }

// Passed returns 0: no owner answers.
func (*Owners) Passed(context.Context, string) uint64 { return 0 }

// Cancel returns [ErrNoOwner].
func (*Owners) Cancel(context.Context, index.Record) (CancelAnswer, error) {
	return 0, ErrNoOwner
}
