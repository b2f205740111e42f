package delayd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// StatusSubject is delayd's unscoped status API (NATS request/reply), the
// operator's form: the request's payload is a message id of any target.
// Publishers use the scoped form, [StatusSubjectFor] (see [Status]).
const StatusSubject = contract.StatusSubject

// StatusSubjectFor returns the scoped status API subject of a target,
// "delayd.api.status.<target>": a request there tells only of a message
// bound for target, as [CancelSubjectFor] does.
func StatusSubjectFor(target string) string { return contract.StatusSubjectFor(target) }

// State is a message's state, as the status API tells it.
type State string

// The four answers of the status API (docs/guide.md#status-ask-without-cancelling). Cancelled,
// AlreadyDelivered and NotFound have the cancel API's texts and codes.
const (
	// Pending: neither handed to its target nor cancelled;
	// [StatusResult].DueAt is when it is due. A snapshot: it may be
	// delivered or cancelled right after.
	Pending State = contract.StatusReplyPending
	// StateCancelled: cancelled; it is never delivered.
	StateCancelled State = contract.CancelReplyCancelled
	// StateDelivered: handed to its target.
	StateDelivered State = contract.CancelReplyDelivered
	// StateNotFound: no pending message has that id and target, and no
	// answer about it is kept (DELAYD_ANSWER_KEEP after it left its level).
	StateNotFound State = contract.CancelReplyNotFound
)

// StatusResult is the status API's answer.
type StatusResult struct {
	State State
	// DueAt is when a [Pending] message is due (its delivery, not a
	// cascade hop), UTC; zero for the other states.
	DueAt time.Time
}

// Status asks delayd the state of the delayed message bound for target
// with the given id (as for [Cancel]: the publisher's Nats-Msg-Id, the
// ingress sequence as decimal text, or the Nats-Msg-Id the message was
// delivered with), without changing it. It requests on
// [StatusSubjectFor](target): a message with that id but another target
// answers [StateNotFound].
//
// Errors are [Cancel]'s: an error wrapping [ErrInvalidTarget] or
// [ErrForbiddenTarget] for a target no message can have;
// nats.ErrNoResponders when no delayd (or none this new) is running; a
// timeout when nc's user may not publish to the subject; a [*CancelError]
// for an error answer, which [errors.Is] matches against [ErrCancelReply]
// and [ErrRouterBehind], [ErrCancelBusy], [ErrAmbiguousID] or
// [ErrCancelFailed].
func Status(ctx context.Context, nc *nats.Conn, target, id string) (StatusResult, error) {
	if err := contract.ValidateTarget(target, "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
		return StatusResult{}, fmt.Errorf("delayd: status: %w", err)
	}
	return status(ctx, nc, StatusSubjectFor(target), id)
}

// StatusAny is [Status] without a target, on the unscoped
// [StatusSubject]: the operator's form.
func StatusAny(ctx context.Context, nc *nats.Conn, id string) (StatusResult, error) {
	return status(ctx, nc, StatusSubject, id)
}

func status(ctx context.Context, nc *nats.Conn, subject, id string) (StatusResult, error) {
	if strings.TrimSpace(id) == "" {
		return StatusResult{}, errors.New("delayd: status: empty id")
	}
	m, err := nc.RequestWithContext(ctx, subject, []byte(id))
	if err != nil {
		return StatusResult{}, fmt.Errorf("delayd: status %q: %w", id, err)
	}
	code, _ := strconv.Atoi(m.Header.Get(contract.HeaderStatus))
	if code == contract.StatusPending {
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
		if err != nil {
			return StatusResult{}, &CancelError{Status: code, Reply: string(m.Data)}
		}
		return StatusResult{State: Pending, DueAt: due.UTC()}, nil
	}
	r, err := cancelAnswer(m)
	if err != nil {
		return StatusResult{}, err
	}
	return StatusResult{State: State(r)}, nil
}
