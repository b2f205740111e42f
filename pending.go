package delayd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// PendingSubjectFor returns the list API subject of a target,
// "delayd.api.pending.<target>": a request there lists only messages bound
// for target, so a server permission on "delayd.api.pending.orders.>" lets
// a user list only messages bound for orders.>.
func PendingSubjectFor(target string) string { return contract.PendingSubjectFor(target) }

// The list API's page sizes: the default, and the largest [WithLimit]
// delayd accepts.
const (
	PendingLimitDefault = contract.PendingLimitDefault
	PendingLimitMax     = contract.PendingLimitMax
)

// ErrBadPendingRequest is matched by the [*PendingError] of a list
// request delayd refused as sent (code 400: a bad limit or cursor).
var ErrBadPendingRequest = errors.New("delayd: pending: bad request")

// PendingOpt is an option of [ListPending].
type PendingOpt func(*contract.PendingRequest) error

// WithLimit sets the most messages of the page: 1..[PendingLimitMax];
// default [PendingLimitDefault].
func WithLimit(n int) PendingOpt {
	return func(r *contract.PendingRequest) error {
		if n < 1 || n > PendingLimitMax {
			return fmt.Errorf("%w: limit %d is not in 1..%d", ErrBadPendingRequest, n, PendingLimitMax)
		}
		r.Limit = n
		return nil
	}
}

// WithCursor asks for the page after the one whose [PendingPage].Next is
// cursor. Give the same due filter as for that page.
func WithCursor(cursor string) PendingOpt {
	return func(r *contract.PendingRequest) error { r.Cursor = cursor; return nil }
}

// WithDueAfter lists only messages due after t (exclusive).
func WithDueAfter(t time.Time) PendingOpt {
	return func(r *contract.PendingRequest) error { r.DueAfter = t; return nil }
}

// WithDueBefore lists only messages due before t (exclusive).
func WithDueBefore(t time.Time) PendingOpt {
	return func(r *contract.PendingRequest) error { r.DueBefore = t; return nil }
}

// WithPayload asks for each message's payload ([PendingMsg].Data).
func WithPayload() PendingOpt {
	return func(r *contract.PendingRequest) error { r.Payload = true; return nil }
}

// PendingPage is one page of a target's pending messages, in due order.
type PendingPage struct {
	Items []PendingMsg
	// Total and NextDue are set on the first page only (a request without
	// [WithCursor]), whatever the due filter: how many messages are pending
	// for the target (or, [ListPendingAny], the subject), and the least due
	// among them (zero when none). Total may count a message cancelled
	// recently, until its level passes it (docs/guide.md#pending-messages).
	// HasTotal says whether they were given.
	Total    int
	NextDue  time.Time
	HasTotal bool
	// Next is the cursor of the next page ([WithCursor]); "" when this
	// page is the last. A page may be shorter than the limit and still
	// have a next one.
	Next string
}

// PendingMsg is one pending message. Its JSON is the list API's item's
// ([contract.PendingItem]: the same names), as delayctl ls --json prints
// it.
type PendingMsg struct {
	// ID is the id [Cancel] takes: the publisher's Nats-Msg-Id, else
	// "seq:<ingress sequence>".
	ID string `json:"id"`
	// Due is when it will be delivered (not its next cascade hop).
	Due time.Time `json:"due"`
	// Enqueued is when delayd first stored it.
	Enqueued time.Time `json:"enqueued,omitzero"`
	Target   string    `json:"target"`
	// Level is the level it waits in now, Stream and Seq its place there.
	Level  string `json:"level"`
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	// Hops is how many times it cascaded to a shorter level so far.
	Hops int `json:"hops,omitempty"`
	// Size is its payload's size in bytes.
	Size     int    `json:"size"`
	MergeKey string `json:"merge_key,omitempty"`
	// Header holds the publisher's headers, as the target will receive
	// them without delayd's own.
	Header nats.Header `json:"headers,omitempty"`
	// Data is the payload, with [WithPayload] only.
	Data []byte `json:"data,omitempty"`
}

// MarshalJSON writes m as the list API writes its item
// ([contract.PendingItem]: the same names, times as the headers write them).
func (m PendingMsg) MarshalJSON() ([]byte, error) {
	return json.Marshal(contract.PendingItem{
		ID: m.ID, Due: m.Due, Enqueued: m.Enqueued, Target: m.Target, Level: m.Level, Stream: m.Stream,
		Seq: m.Seq, Hops: m.Hops, Size: m.Size, MergeKey: m.MergeKey, Headers: m.Header, Data: m.Data,
	})
}

// ListPending lists a page of the messages pending for target (the subject
// given to [Publish]), in due order: a request to
// [PendingSubjectFor](target) (docs/guide.md#pending-messages). (It is not
// named Pending: that is the status API's [State].) Follow
// [PendingPage].Next with [WithCursor] for the next page.
//
// Errors: an error wrapping [ErrInvalidTarget] or [ErrForbiddenTarget] for
// a target no message can have, or [ErrBadPendingRequest] for a bad
// option (a target under delayd's ingress prefix, which nc does not
// know, is refused by delayd: a [*PendingError] matching
// [ErrBadPendingRequest]); nats.ErrNoResponders when no delayd is running on nc's server;
// a timeout when nc's user may not publish to the subject; a
// [*PendingError] for an error answer, which [errors.Is] matches against
// [ErrBadPendingRequest] (400), [ErrCancelBusy] (429), [ErrRouterBehind]
// (503) or [ErrCancelFailed] (any other).
func ListPending(ctx context.Context, nc *nats.Conn, target string, opts ...PendingOpt) (*PendingPage, error) {
	if err := contract.ValidateTarget(target, "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
		return nil, fmt.Errorf("delayd: pending: %w", err)
	}
	var req contract.PendingRequest
	return listPending(ctx, nc, PendingSubjectFor(target), target, req, opts)
}

// PendingSubject is the list API's operator form ([ListPendingAny]): a
// request there lists across targets. Grant it only to operators, as the
// unscoped [CancelSubject] (docs/operations.md#security).
const PendingSubject = contract.PendingSubject

// ListPendingAny is [ListPending] across targets, on the operator form's
// [PendingSubject]: the messages pending for every target subject matches
// (a subject with wildcards; "" is ">", every target), in due order, each
// with its [PendingMsg].Target. Its errors are [ListPending]'s; a subject
// that is not a valid subject filter is refused by delayd (a
// [*PendingError] matching [ErrBadPendingRequest]).
func ListPendingAny(ctx context.Context, nc *nats.Conn, subject string, opts ...PendingOpt) (*PendingPage, error) {
	req := contract.PendingRequest{Subject: subject}
	return listPending(ctx, nc, PendingSubject, cmp.Or(subject, ">"), req, opts)
}

func listPending(ctx context.Context, nc *nats.Conn, subject, what string, req contract.PendingRequest, opts []PendingOpt) (*PendingPage, error) {
	target := what
	for _, opt := range opts {
		if err := opt(&req); err != nil {
			return nil, err
		}
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("delayd: pending: %w", err)
	}
	m, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		return nil, fmt.Errorf("delayd: pending %s: %w", target, err)
	}
	if code, _ := strconv.Atoi(m.Header.Get(contract.HeaderStatus)); code != contract.PendingStatusOK {
		return nil, &PendingError{Status: code, Reply: string(m.Data)}
	}
	var reply contract.PendingReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("delayd: pending %s: reply is not JSON: %w", target, err)
	}
	page := &PendingPage{Items: make([]PendingMsg, 0, len(reply.Items)), Next: reply.Next, NextDue: reply.NextDue}
	if reply.Total != nil {
		page.Total, page.HasTotal = *reply.Total, true
	}
	for _, it := range reply.Items {
		page.Items = append(page.Items, PendingMsg{
			ID: it.ID, Due: it.Due, Enqueued: it.Enqueued, Target: it.Target, Level: it.Level, Stream: it.Stream,
			Seq: it.Seq, Hops: it.Hops, Size: it.Size, MergeKey: it.MergeKey, Header: nats.Header(it.Headers), Data: it.Data,
		})
	}
	return page, nil
}

// PendingError is the error [ListPending] returns for an error answer of the
// list API.
type PendingError struct {
	// Status is the answer's code (0 for a reply without one).
	Status int
	// Reply is the reply's body: "error: " and the reason.
	Reply string
}

// Error returns "delayd: pending: " and the quoted reply.
func (e *PendingError) Error() string { return fmt.Sprintf("delayd: pending: %q", e.Reply) }

// Is reports whether target is the sentinel of e's Status.
func (e *PendingError) Is(target error) bool {
	switch target {
	case ErrBadPendingRequest:
		return e.Status == contract.CancelStatusBadRequest
	case ErrRouterBehind:
		return e.Status == contract.CancelStatusRouterBehind
	case ErrCancelBusy:
		return e.Status == contract.CancelStatusBusy
	case ErrCancelFailed:
		switch e.Status {
		case contract.CancelStatusBadRequest, contract.CancelStatusRouterBehind, contract.CancelStatusBusy:
			return false
		}
		return true
	}
	return false
}
