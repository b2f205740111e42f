package delayd

import (
	"errors"
	"fmt"
	"time"

	"github.com/delayd/delayd/contract"
)

// Errors of [Publish] and its options. Returned errors wrap one of these
// (or a NATS error), so match them with [errors.Is].
var (
	// ErrNoDelay is returned by [Publish] when no delay option was given.
	ErrNoDelay = errors.New("delayd: no delay given (use WithLevel, WithDuration or WithDeliverAt)")

	// ErrAmbiguousDelay is returned by [Publish] when more than one delay
	// option was given.
	ErrAmbiguousDelay = errors.New("delayd: more than one of WithLevel, WithDuration and WithDeliverAt")

	// ErrInvalidLevel is wrapped by [Publish]'s error for a bad delay level:
	// a negative [WithLevel].
	ErrInvalidLevel = errors.New("delayd: invalid delay level")

	// ErrInvalidDelay is wrapped by [Publish]'s error for a bad duration or
	// deliver-at time: a negative [WithDuration], or a [WithDuration] or
	// [WithDeliverAt] beyond the running delayd's max delay
	// (DELAYD_MAX_DELAY), which delayd would dead-letter with reason
	// "level". A [Reschedule]'s error wraps it for a negative [In] or a
	// zero [At], and its [*CancelError] matches it for delayd's 400 answer
	// to the delay (beyond the max delay).
	ErrInvalidDelay = errors.New("delayd: invalid delay")

	// ErrInvalidMergeKey is wrapped by [Publish]'s error for an empty or
	// blank [WithMergeKey].
	ErrInvalidMergeKey = errors.New("delayd: invalid merge key")

	// ErrNoInfo is returned by [Publish] with [WithRequireInfo] when no
	// delayd answers the info API.
	ErrNoInfo = errors.New("delayd: no delayd answered on " + InfoSubject)

	// ErrTooLarge is returned by [Publish] for a message whose headers and
	// payload leave less than delayd's header reserve under the server's
	// max payload: delayd would dead-letter it with reason "size".
	ErrTooLarge = errors.New("delayd: message too large")

	// ErrPrefixMismatch is returned by [Publish] when [WithPrefix] names
	// another prefix than the running delayd's.
	ErrPrefixMismatch = errors.New("delayd: prefix differs from the running delayd's DELAYD_PREFIX")

	// ErrDuplicate is matched by a [*DuplicateError]: the stream dropped
	// the message as a duplicate of one it stored earlier with the same
	// Nats-Msg-Id, and stored nothing.
	ErrDuplicate = errors.New("delayd: duplicate message id")
)

// DuplicateError is [Publish]'s error when the ingress stream stored
// nothing: it already held a message published with the same Nats-Msg-Id
// within its duplicate window ([contract.DuplicateWindow], 2 min), and its
// PubAck said "duplicate". [errors.Is] matches it against [ErrDuplicate].
//
// The stream cannot tell the two causes apart. A publish sent again after
// a lost PubAck or a timeout finds its own first copy: the message is
// stored once, and the error can be taken for success. An id re-used for
// another message, for example to move a cancelled message to a new time,
// is never delivered: publish it with a new id, or move the pending
// message with [Reschedule], which keeps its id
// (docs/guide.md#re-using-an-id).
type DuplicateError struct {
	// ID is the Nats-Msg-Id the message was published with.
	ID string
	// Stream is the stream that dropped it, DELAYD_INGRESS.
	Stream string
	// Sequence is the stream sequence of the message stored earlier with
	// ID.
	Sequence uint64
	// Window is the stream's duplicate window.
	Window time.Duration
}

// Error says what was dropped, why, and what to do.
func (e *DuplicateError) Error() string {
	return fmt.Sprintf("%v %q: %s stored a message with this Nats-Msg-Id (sequence %d) within its duplicate window (%s) "+
		"and dropped this one: nothing stored. A repeat of a publish that succeeded needs nothing more; "+
		"a new message needs a new id, or this one once the window has passed",
		ErrDuplicate, e.ID, e.Stream, e.Sequence, e.Window)
}

// Is reports whether target is [ErrDuplicate].
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// Errors for a target subject delayd refuses, the contract's sentinels:
// [Publish], [Cancel], [Reschedule], [Retry] and [RetryMsg] return errors
// wrapping them.
var (
	// ErrInvalidTarget means the target is empty, has empty tokens,
	// wildcards or white space, or is otherwise not a valid NATS subject.
	ErrInvalidTarget = contract.ErrInvalidTarget

	// ErrForbiddenTarget means the target starts with '$', or lies under
	// the ingress prefix or delayd's internal subjects ("delayd.>").
	ErrForbiddenTarget = contract.ErrForbiddenTarget

	// ErrDeniedTarget means the running delayd's target policy
	// (DELAYD_ALLOW_TARGETS, DELAYD_DENY_TARGETS) refuses the target.
	ErrDeniedTarget = contract.ErrDeniedTarget
)

// Errors of the cancel API, as [Cancel] and [CancelAny] report them
// (docs/guide.md#cancel). A reply's Delay-Status code tells them apart; match them with
// [errors.Is].
var (
	// ErrCancelReply is matched by every [*CancelError]: an error answer of
	// the cancel API, or a reply that is none of its answers.
	ErrCancelReply = errors.New("delayd: unexpected cancel reply")

	// ErrNotFound is [CancelResult.Err] of [NotFound] (code 404): no
	// pending or recently passed message has that id and target.
	ErrNotFound = errors.New("delayd: cancel: not found")

	// ErrAlreadyDelivered is [CancelResult.Err] of [AlreadyDelivered]
	// (code 409): the message was handed to its target before the cancel
	// was decided.
	ErrAlreadyDelivered = errors.New("delayd: cancel: already delivered")

	// ErrAmbiguousID is matched by a [*CancelError] of code 400: a decimal
	// id names both a publisher's Nats-Msg-Id and an ingress sequence; send
	// "seq:N" or "id:N".
	ErrAmbiguousID = errors.New("delayd: cancel: ambiguous id")

	// ErrRouterBehind is matched by a [*CancelError] of code 503: the
	// router has not yet placed every message published before the cancel,
	// so the answer is not known yet. Send the request again.
	ErrRouterBehind = errors.New("delayd: cancel: the router is behind; try again")

	// ErrCancelBusy is matched by a [*CancelError] of code 429: more
	// cancel requests were waiting than delayd works through promptly (a
	// cancel storm), so this one was answered at once without a look.
	// Send it again after a pause.
	ErrCancelBusy = errors.New("delayd: cancel: busy; try again")

	// ErrCancelFailed is matched by a [*CancelError] of code 500 (or any
	// code it does not know): delayd could not decide, for example a
	// stream operation failed. Send the request again.
	ErrCancelFailed = errors.New("delayd: cancel failed")
)

// Errors of [ParseLadder], [Ladder.Validate], [Retry] and [RetryMsg].
// Returned errors wrap one of these (or a NATS error), so match them with
// [errors.Is].
var (
	// ErrInvalidLadder means a ladder is empty, longer than
	// [LadderMaxRungs], or has a rung that does not parse or is not > 0.
	ErrInvalidLadder = errors.New("delayd: invalid retry ladder")
	// ErrInvalidRetry means the delivered message cannot be retried: it is
	// nil, has no subject, or its Delay-Attempt header is not one
	// non-negative integer.
	ErrInvalidRetry = errors.New("delayd: cannot retry message")
	// ErrRetriesExhausted starts the Delay-Error of a message dead-lettered
	// after its ladder's last rung. Retry does not return it: a dead letter
	// written is a success, reported by [RetryResult].DeadLettered.
	ErrRetriesExhausted = errors.New("retries exhausted")
)
