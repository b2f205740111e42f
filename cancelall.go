package delayd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// CancelAllSubjectFor returns the cancel-all API subject of a target,
// "delayd.api.cancelall.<target>": a request there cancels only messages
// bound for target, so a server permission on
// "delayd.api.cancelall.orders.>" lets a user cancel everything pending
// only for orders.>. It is not under [CancelSubjectFor]'s subjects, so
// granting single cancels does not grant cancel-all.
func CancelAllSubjectFor(target string) string { return contract.CancelAllSubjectFor(target) }

// CancelAllResult is the answer of delayd's cancel-all API.
type CancelAllResult struct {
	// Cancelled is how many messages the request cancelled: each will
	// never be delivered.
	Cancelled int
	// AlreadyDelivered is how many it found pending that were delivered
	// before their cancel was decided.
	AlreadyDelivered int
	// Complete is false when the request's budget (20 s of work) ran out
	// first: send it again to cancel the rest (what is cancelled stays
	// cancelled and is not counted again). A request sent again also
	// cancels what was published since the first.
	Complete bool
}

// CancelAll asks delayd to cancel every message pending for target (the
// subject given to [Publish]) that was published before the request, and
// returns how many it cancelled: one request to
// [CancelAllSubjectFor](target) (docs/guide.md#cancel-everything-pending-for-a-target).
// Each message is decided as [Cancel] decides one, by its level's owner:
// a message counted in Cancelled is never delivered. Messages published
// after the request reached delayd are not cancelled.
//
// Errors are [Cancel]'s: an error wrapping [ErrInvalidTarget] or
// [ErrForbiddenTarget] for a target no message can have;
// nats.ErrNoResponders when no delayd is running on nc's server; a
// timeout when nc's user may not publish to the subject; a [*CancelError]
// for an error answer ([ErrCancelBusy], [ErrRouterBehind]: try again;
// [ErrCancelFailed]). After an error answer, some messages may have been
// cancelled: a request sent again cancels the rest.
func CancelAll(ctx context.Context, nc *nats.Conn, target string) (CancelAllResult, error) {
	if err := contract.ValidateTarget(target, "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
		return CancelAllResult{}, fmt.Errorf("delayd: cancel-all: %w", err)
	}
	m, err := nc.RequestWithContext(ctx, CancelAllSubjectFor(target), nil)
	if err != nil {
		return CancelAllResult{}, fmt.Errorf("delayd: cancel-all %s: %w", target, err)
	}
	if code, _ := strconv.Atoi(m.Header.Get(contract.HeaderStatus)); code != contract.CancelAllStatusOK {
		return CancelAllResult{}, &CancelError{Status: code, Reply: string(m.Data)}
	}
	var reply contract.CancelAllReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return CancelAllResult{}, fmt.Errorf("delayd: cancel-all %s: reply is not JSON: %w", target, err)
	}
	return CancelAllResult{Cancelled: reply.Cancelled, AlreadyDelivered: reply.AlreadyDelivered, Complete: reply.Complete}, nil
}
