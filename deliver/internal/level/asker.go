package level

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/lease"
)

// CancelAnswer is a scanner's decision on a cancel.
type CancelAnswer int

const (
	AnswerCancelled   CancelAnswer = iota // pending: now never delivered
	AnswerDelivered                       // handed to its target already
	AnswerForwarded                       // moved on to its next level: look again
	AnswerGone                            // no such message at that sequence
	AnswerRetry                           // not stored yet: look again
	AnswerPending                         // a status request's: not handed off, not cancelled
	AnswerRescheduled                     // a reschedule's: pending, now delivered at the new due only
)

// AskOp is what an [Ask] asks of a level owner about one message.
type AskOp int

const (
	// AskCancel cancels the message: AnswerCancelled if it was pending.
	AskCancel AskOp = iota
	// AskStatus tells, reserving nothing: AnswerPending if it is pending.
	AskStatus
	// AskReschedule moves the message to Ask.Due: AnswerRescheduled if it
	// was pending (docs/pending.md#2-reschedule).
	AskReschedule
)

// Ask is one question to a level owner about the message a record
// places: a cancel, a status, or a reschedule to Due.
type Ask struct {
	Op AskOp
	// Due is a reschedule's new due, a server time; zero for the others.
	Due time.Time
}

// ErrNoOwner: no replica answered for the level as its owner (none holds
// its lease now, or the one that did is stopping or paused); the decision
// can be asked again.
var ErrNoOwner = errors.New("no owner answered")

// Asker asks the owner of a level stream, wherever it runs: this replica's
// owner for the current term ([local]), or another replica's over the
// level's decide subject (contract.DecideSubject; [remote]). [Owners] picks
// one of the two per question; it is the only way into a level owner from
// another goroutine
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
	// Decide has the owner decide ask about the message rec places. A
	// cancel (AskCancel): the owner reserves the sequence between two
	// deliveries, and the caller does the I/O (read with reader,
	// tombstone, PubAck, fenced owner check). A status (AskStatus) is
	// decided as a cancel but reserves nothing: AnswerPending for a
	// message neither handed off nor cancelled; reader may be nil. A
	// reschedule (AskReschedule) is reserved as a cancel, and the caller
	// moves the message (intent, fenced check, new message:
	// docs/pending.md#22-the-writes-in-order): AnswerRescheduled once the
	// new message is stored. Asking again is safe.
	Decide(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error)
	// Sift answers which of seqs the owner of stream still holds pending
	// ([Sifted]), for the list API; an error without an answer (never a
	// guess).
	Sift(ctx context.Context, stream string, seqs []uint64) (Sifted, error)
}

// local asks this replica's owner of the level, the one its term slot
// holds: without one it answers as no owner does (not pending, 0, an error
// wrapping ownership.ErrNotOwner). Pending and Passed read the owner's published
// view on the caller's goroutine, without the loop's turn (docs/reshape.md
// R6), and so does Sift; Decide sends a request to the loop and does a
// reserved cancel's I/O on the caller's goroutine.
type local struct{ l *Level }

var _ Asker = local{}

// Pending is the owner's pending (it waits for the term's load up to
// [DecidePendingWait]).
func (a local) Pending(ctx context.Context, rec index.Record) bool {
	o := a.l.slot.get()
	if o == nil {
		return false
	}
	return o.pending(ctx, rec)
}

// Passed is the owner's passed once its term's load has loaded the
// offset; 0 before.
func (a local) Passed(context.Context, string) uint64 {
	if o := a.l.slot.get(); o != nil {
		return o.passedNow()
	}
	return 0
}

// Decide is the current owner's decision of ask ([Level.request]).
func (a local) Decide(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error) {
	return a.l.request(ctx, reader, rec, ask)
}

// OwnersConfig configures [Owners].
type OwnersConfig struct {
	// Conn carries the questions to the owners on other replicas.
	// Required.
	Conn *nats.Conn
	// Levels are this replica's levels, by stream name: a stream not
	// among them is unknown (not pending, nothing passed, AnswerGone).
	Levels map[string]*Level
	// LeaseTTL is the levels' lease TTL: a cancel or status request finds
	// no owner for up to twice it before it gives up. Optional. Default
	// [lease.TTLDefault], the service's (a zero TTL would make one try).
	LeaseTTL time.Duration
}

// Owners is the one [Asker] every other package holds: by stream, it asks
// this replica's owner of the level ([local]) while a term of the level's
// lease runs here, and the owner on another replica ([remote]) otherwise.
// Safe for concurrent use.
type Owners struct {
	levels   map[string]*Level // immutable after NewOwners
	remote   *remote
	leaseTTL time.Duration
}

var _ Asker = (*Owners)(nil)

// NewOwners returns the Owners of cfg.Levels.
func NewOwners(cfg OwnersConfig) *Owners {
	return &Owners{levels: cfg.Levels, remote: newRemote(cfg.Conn), leaseTTL: cmp.Or(cfg.LeaseTTL, lease.TTLDefault)}
}

// Pending reports the owner's answer to "is the message rec places
// pending?": this replica's owner's once its term's load has loaded
// (waiting up to DecidePendingWait for it), the owner's elsewhere
// otherwise. No answer (no owner, a failover, a timeout) is "not
// pending": that costs a merge, never a message merged into one already
// delivered.
func (w *Owners) Pending(ctx context.Context, rec index.Record) bool {
	l := w.levels[rec.Stream]
	switch {
	case l == nil:
		return false
	case l.Owned():
		return local{l}.Pending(ctx, rec)
	}
	return w.remote.Pending(ctx, rec)
}

// Passed returns the highest sequence the owner of stream handed off,
// from this replica's owner when it owns the level, and otherwise from
// the level's owner; 0 (nothing passed) without an answer.
func (w *Owners) Passed(ctx context.Context, stream string) uint64 {
	l := w.levels[stream]
	switch {
	case l == nil:
		return 0
	case l.Owned():
		return local{l}.Passed(ctx, stream)
	}
	return w.remote.Passed(ctx, stream)
}

// Decide has the level's owner decide ask (a cancel, a status, a
// reschedule) about the message rec places: this replica's owner if a term runs
// here, else the owner, through the level's decide subject
// ([contract.DecideSubject]). While no replica answers as the owner (the
// lease is changing hands: a start, a crash, a pause), it asks again with
// backoff for up to twice the lease TTL, then gives up with an error to
// send the request again. Asking again is safe: a sequence already
// cancelled answers "cancelled". A level stream this replica does not
// know answers AnswerGone.
func (w *Owners) Decide(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error) {
	l := w.levels[rec.Stream]
	if l == nil {
		return AnswerGone, nil
	}
	deadline := time.Now().Add(2 * w.leaseTTL)
	pause := 10 * time.Millisecond
	for {
		var (
			answer CancelAnswer
			err    error
		)
		if l.Owned() {
			if answer, err = (local{l}).Decide(ctx, reader, rec, ask); !errors.Is(err, ownership.ErrNotOwner) {
				return answer, err
			}
		} else if answer, err = w.remote.Decide(ctx, reader, rec, ask); !errors.Is(err, ErrNoOwner) {
			return answer, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("level stream %s has no owner deciding now (its lease is changing hands: %v); send the request again", rec.Stream, err)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return 0, err
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}
