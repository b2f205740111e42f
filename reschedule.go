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

// RescheduleSubject is delayd's unscoped reschedule API, the operator's
// form ([RescheduleAny]): a request there moves a message of any target.
// Grant it only to operators, as the unscoped [CancelSubject]
// (docs/operations.md#security).
const RescheduleSubject = contract.RescheduleSubject

// RescheduleSubjectFor returns the reschedule API subject of a target,
// "delayd.api.reschedule.<target>": a request there moves only a message
// bound for target, so a server permission on
// "delayd.api.reschedule.orders.>" lets a user move only messages bound
// for orders.>.
func RescheduleSubjectFor(target string) string { return contract.RescheduleSubjectFor(target) }

// HeaderRescheduled is set on the delivery of a message that was
// rescheduled: how many times it was ("Delay-Rescheduled: 1"), as
// [HeaderHops] counts its cascade hops.
const HeaderRescheduled = contract.HeaderRescheduled

// When is the new delay of a [Reschedule], given as a publisher gives one:
// [In], [At], [AtLevel] or [Now]. Its zero value is no delay, refused
// with [ErrNoDelay].
type When struct {
	header, value string // the request's delay header and its value
	err           error
}

// In moves the message to d after delayd receives the request (d >= 0; 0
// is [Now]), the request's Delay-Duration. A negative d is refused with an
// error wrapping [ErrInvalidDelay]; one beyond the running delayd's max
// delay (DELAYD_MAX_DELAY) is refused by delayd, the same way.
func In(d time.Duration) When {
	if d < 0 {
		return When{err: fmt.Errorf("%w: duration %s is negative", ErrInvalidDelay, d)}
	}
	return When{header: HeaderDuration, value: d.String()}
}

// At moves the message to t, the request's Delay-Deliver-At (written in
// UTC with nanoseconds); a time in the past is [Now]. The zero time is
// refused with an error wrapping [ErrInvalidDelay].
func At(t time.Time) When {
	if t.IsZero() {
		return When{err: fmt.Errorf("%w: the zero time", ErrInvalidDelay)}
	}
	return When{header: HeaderDeliverAt, value: contract.FormatTime(t)}
}

// AtLevel moves the message to level n's delay after delayd receives the
// request, the request's Delay-Level, as [WithLevel] gives it: 0 is
// [Now], above the table is clamped to its highest level by delayd. A
// negative n is refused with an error wrapping [ErrInvalidLevel].
func AtLevel(n int) When {
	if n < 0 {
		return When{err: fmt.Errorf("%w: %d is negative", ErrInvalidLevel, n)}
	}
	return When{header: HeaderLevel, value: strconv.Itoa(n)}
}

// Now delivers the message at once ("run now"): the request's
// Delay-Duration "0s".
func Now() When { return When{header: HeaderDuration, value: "0s"} }

// String returns the delay as the request's header gives it,
// "Delay-Duration: 2h0m0s".
func (w When) String() string {
	if w.header == "" {
		return "no delay"
	}
	return w.header + ": " + w.value
}

// RescheduleAnswer is an answer of delayd's reschedule API.
type RescheduleAnswer string

// The three answers of the reschedule API (docs/guide.md#pending-messages).
const (
	// Rescheduled: the message was pending, and is now delivered once at
	// its new due (RescheduleResult.DueAt), never at its old one.
	Rescheduled RescheduleAnswer = contract.RescheduleReplyRescheduled
	// RescheduleNotFound: no message with that id and target is pending
	// (unknown, cancelled, or another target's).
	RescheduleNotFound RescheduleAnswer = contract.CancelReplyNotFound
	// RescheduleDelivered: the message was handed to its target before the
	// reschedule was decided; nothing was moved.
	RescheduleDelivered RescheduleAnswer = contract.CancelReplyDelivered
)

// RescheduleResult is the answer of a [Reschedule].
type RescheduleResult struct {
	Result RescheduleAnswer
	// DueAt is the new due with [Rescheduled] (the reply's Delay-Due-At,
	// by delayd's clock: a run now is the time delayd received the
	// request), the zero time otherwise.
	DueAt time.Time
}

// Err returns nil for [Rescheduled], [ErrNotFound] for
// [RescheduleNotFound] and [ErrAlreadyDelivered] for
// [RescheduleDelivered], for callers that treat every answer but
// Rescheduled as an error. The zero result that comes with an error wraps
// [ErrCancelReply].
func (r RescheduleResult) Err() error {
	switch r.Result {
	case Rescheduled:
		return nil
	case RescheduleNotFound:
		return ErrNotFound
	case RescheduleDelivered:
		return ErrAlreadyDelivered
	}
	return fmt.Errorf("%w: %q", ErrCancelReply, string(r.Result))
}

// Reschedule asks delayd to move the pending message bound for target
// (the subject given to [Publish]) with the given id (as [Cancel] takes
// it) to the new delay when, and returns delayd's answer: one request to
// [RescheduleSubjectFor](target), the id as payload and when's header on it
// (docs/guide.md#pending-messages). The message keeps its id, payload
// and headers, and is delivered exactly once: never before its new due,
// never at its old one; its delivery carries [HeaderRescheduled]. A
// message with that id but another target answers [RescheduleNotFound],
// exactly like an unknown id. The decision is its level owner's, as a
// cancel's.
//
// Errors are [Cancel]'s: an error wrapping [ErrInvalidTarget] or
// [ErrForbiddenTarget] for a target no message can have; an error wrapping
// [ErrNoDelay], [ErrInvalidDelay] or [ErrInvalidLevel] for a bad when,
// before any request; nats.ErrNoResponders when no delayd is running on
// nc's server; a timeout when nc's user may not publish to the subject; a
// [*CancelError] for an error answer, which [errors.Is] matches against
// [ErrCancelReply] and the answer's sentinel: [ErrInvalidDelay] (400: a
// due beyond delayd's max delay), [ErrAmbiguousID] (400), [ErrRouterBehind]
// or [ErrCancelBusy] (try again), or [ErrCancelFailed]. After an
// [ErrCancelFailed] the move may have been stored and finished later: ask
// the message's [State], or list it, before moving it again.
func Reschedule(ctx context.Context, nc *nats.Conn, target, id string, when When) (RescheduleResult, error) {
	if err := contract.ValidateTarget(target, "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
		return RescheduleResult{}, fmt.Errorf("delayd: reschedule: %w", err)
	}
	return reschedule(ctx, nc, RescheduleSubjectFor(target), id, when)
}

// RescheduleAny is [Reschedule] without a target, on the unscoped
// [RescheduleSubject]: the operator's form, for a message of any target.
func RescheduleAny(ctx context.Context, nc *nats.Conn, id string, when When) (RescheduleResult, error) {
	return reschedule(ctx, nc, RescheduleSubject, id, when)
}

func reschedule(ctx context.Context, nc *nats.Conn, subject, id string, when When) (RescheduleResult, error) {
	switch {
	case when.err != nil:
		return RescheduleResult{}, fmt.Errorf("delayd: reschedule: %w", when.err)
	case when.header == "":
		return RescheduleResult{}, fmt.Errorf("delayd: reschedule: %w", ErrNoDelay)
	case strings.TrimSpace(id) == "":
		return RescheduleResult{}, errors.New("delayd: reschedule: empty id")
	}
	req := &nats.Msg{Subject: subject, Header: nats.Header{when.header: {when.value}}, Data: []byte(id)}
	reply, err := nc.RequestMsgWithContext(ctx, req)
	if err != nil {
		return RescheduleResult{}, fmt.Errorf("delayd: reschedule %q: %w", id, err)
	}
	return rescheduleAnswer(reply)
}

// rescheduleAnswer maps a reschedule API reply to its answer or error, by
// its Delay-Status code (cancel's, and 200 for rescheduled).
func rescheduleAnswer(m *nats.Msg) (RescheduleResult, error) {
	code, err := strconv.Atoi(m.Header.Get(contract.HeaderStatus))
	if err != nil {
		return RescheduleResult{}, &CancelError{Reply: string(m.Data), op: opReschedule}
	}
	switch code {
	case contract.RescheduleStatusRescheduled:
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
		if err != nil || string(m.Data) != contract.RescheduleReplyRescheduled {
			return RescheduleResult{}, &CancelError{Status: code, Reply: string(m.Data), op: opReschedule}
		}
		return RescheduleResult{Result: Rescheduled, DueAt: due}, nil
	case contract.CancelStatusNotFound:
		return RescheduleResult{Result: RescheduleNotFound}, nil
	case contract.CancelStatusDelivered:
		return RescheduleResult{Result: RescheduleDelivered}, nil
	}
	return RescheduleResult{}, &CancelError{Status: code, Reply: string(m.Data), op: opReschedule}
}
