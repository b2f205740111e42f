// Package delayd is the publisher's side of delayd, NATS JetStream delayed
// delivery by level: the header names of the contract, and [Publish], which
// validates a delayed message the way delayd's router would and publishes
// it through JetStream, so a publisher gets the router's error at once
// instead of finding the message in the dead-letter stream.
//
// Delay levels follow RocketMQ 4's ScheduleMessageService: a 1-based index
// into delayd's level table; 0 delivers at once, and an index above the
// table is clamped to its highest level by delayd.
package delayd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
)

// Header names of the contract.
const (
	// HeaderLevel carries the delay level, "Delay-Level: 3".
	HeaderLevel = contract.HeaderLevel
	// HeaderEnqueuedAt is set on deliveries: when the ingress stream stored the message (RFC 3339, ns, UTC).
	HeaderEnqueuedAt = contract.HeaderEnqueuedAt
	// HeaderDueAt is set on deliveries: when the message became due (RFC 3339, ns, UTC).
	HeaderDueAt = contract.HeaderDueAt
	// HeaderDuration asks for any delay, as a Go duration.
	HeaderDuration = contract.HeaderDuration
	// HeaderDeliverAt asks for delivery at an RFC 3339 time.
	HeaderDeliverAt = contract.HeaderDeliverAt
	// HeaderHops is set on deliveries that cascaded through levels.
	HeaderHops = contract.HeaderHops
	// HeaderError is set on dead letters: the one-line reason.
	HeaderError = contract.HeaderError
	// HeaderSubject is set on dead letters: the subject the message was published to.
	HeaderSubject = contract.HeaderSubject
	// HeaderMsgID is set on dead letters that carried a publisher Nats-Msg-Id.
	HeaderMsgID = contract.HeaderMsgID
	// HeaderMergeKey coalesces pending messages with the same key and target.
	HeaderMergeKey = contract.HeaderMergeKey
	// HeaderAttempt is set by retry ladders: which retry a delivery is (1, 2, ...).
	HeaderAttempt = contract.HeaderAttempt
	// HeaderStatus is set on cancel API replies: the answer's code, "200",
	// "404", "409", "400", "503" or "500" (docs/guide.md#cancel).
	HeaderStatus = contract.HeaderStatus
)

// CancelSubject is delayd's unscoped cancel API (NATS request/reply), the
// operator's form: the request's payload is a message id of any target, the
// reply one of the [CancelResult] texts. Publishers use the scoped form,
// [CancelSubjectFor] (see [Cancel]).
const CancelSubject = contract.CancelSubject

// CancelSubjectFor returns the scoped cancel API subject of a target,
// "delayd.api.cancel.<target>": a request there cancels only a message
// bound for target, so a server permission on "delayd.api.cancel.orders.>"
// lets a user cancel only messages bound for orders.>.
func CancelSubjectFor(target string) string { return contract.CancelSubjectFor(target) }

// CancelResult is the reply of delayd's cancel API.
type CancelResult string

// The three answers of the cancel API (docs/guide.md#cancel).
const (
	// Cancelled: the message was pending and will never be delivered.
	Cancelled CancelResult = contract.CancelReplyCancelled
	// NotFound: no pending or recently delivered message has that id.
	NotFound CancelResult = contract.CancelReplyNotFound
	// AlreadyDelivered: the message was handed to its target before the
	// cancel was decided.
	AlreadyDelivered CancelResult = contract.CancelReplyDelivered
)

// Err returns nil for [Cancelled], [ErrNotFound] for [NotFound] and
// [ErrAlreadyDelivered] for [AlreadyDelivered], for callers that treat
// every answer but Cancelled as an error: err := res.Err(). Any other value
// (the zero CancelResult that comes with an error) wraps [ErrCancelReply].
func (r CancelResult) Err() error {
	switch r {
	case Cancelled:
		return nil
	case NotFound:
		return ErrNotFound
	case AlreadyDelivered:
		return ErrAlreadyDelivered
	}
	return fmt.Errorf("%w: %q", ErrCancelReply, string(r))
}

// Cancel asks delayd to cancel the delayed message bound for target (the
// subject given to [Publish], e.g. "orders.close") with the given id (as
// returned by [Publish]: the publisher's Nats-Msg-Id, or the ingress
// sequence as decimal text) and returns delayd's answer. It requests on
// [CancelSubjectFor](target): a message with that id but another target
// answers [NotFound], exactly like an unknown id. A Cancelled answer
// guarantees the message is never delivered.
//
// Errors: an error wrapping [ErrInvalidTarget] or [ErrForbiddenTarget] for
// a target no message can have (empty, wildcards, '$', under "delayd.");
// nats.ErrNoResponders when no delayd is running on nc's server; a timeout
// (context.DeadlineExceeded or nats.ErrTimeout) when nc's user may not
// publish to the subject: the server drops the request and reports
// nats.ErrPermissionViolation to nc's error handler; a [*CancelError] for
// an error answer, which [errors.Is] matches against [ErrCancelReply] and
// the answer's sentinel: [ErrRouterBehind] or [ErrCancelBusy] (try
// again), [ErrAmbiguousID] or [ErrCancelFailed]. [NotFound] and [AlreadyDelivered] are answers, not
// errors: [CancelResult.Err] maps them to [ErrNotFound] and
// [ErrAlreadyDelivered].
func Cancel(ctx context.Context, nc *nats.Conn, target, id string) (CancelResult, error) {
	if err := contract.ValidateTarget(target, "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
		return "", fmt.Errorf("delayd: cancel: %w", err)
	}
	return cancel(ctx, nc, CancelSubjectFor(target), id)
}

// CancelAny is [Cancel] without a target, on the unscoped [CancelSubject]:
// the operator's form, for a message of any target. Grant that subject only
// to operators (docs/operations.md#security).
func CancelAny(ctx context.Context, nc *nats.Conn, id string) (CancelResult, error) {
	return cancel(ctx, nc, CancelSubject, id)
}

func cancel(ctx context.Context, nc *nats.Conn, subject, id string) (CancelResult, error) {
	if strings.TrimSpace(id) == "" {
		return "", errors.New("delayd: cancel: empty id")
	}
	reply, err := nc.RequestWithContext(ctx, subject, []byte(id))
	if err != nil {
		return "", fmt.Errorf("delayd: cancel %q: %w", id, err)
	}
	return cancelAnswer(reply)
}

// cancelAnswer maps a cancel API reply to its answer or error: by its
// Delay-Status code, or by its text when it has none (a delayd from before
// the codes).
func cancelAnswer(m *nats.Msg) (CancelResult, error) {
	status := m.Header.Get(contract.HeaderStatus)
	if status == "" {
		switch r := CancelResult(m.Data); r {
		case Cancelled, NotFound, AlreadyDelivered:
			return r, nil
		}
		return "", &CancelError{Reply: string(m.Data)}
	}
	code, err := strconv.Atoi(status)
	if err != nil {
		return "", &CancelError{Reply: string(m.Data)}
	}
	switch code {
	case contract.CancelStatusCancelled:
		return Cancelled, nil
	case contract.CancelStatusNotFound:
		return NotFound, nil
	case contract.CancelStatusDelivered:
		return AlreadyDelivered, nil
	}
	return "", &CancelError{Status: code, Reply: string(m.Data)}
}

// CancelError is the error [Cancel] and [CancelAny] return for an error
// answer of the cancel API, or for a reply they do not know. [errors.Is]
// matches it against [ErrCancelReply] always, and against the sentinel of
// its Status: [ErrAmbiguousID] (400), [ErrCancelBusy] (429),
// [ErrRouterBehind] (503) or [ErrCancelFailed] (500, or any other code).
// [Reschedule] and [RescheduleAny] return it too: their 400 answer for a
// bad delay matches [ErrInvalidDelay] instead of [ErrAmbiguousID].
type CancelError struct {
	// Status is the answer's code (docs/guide.md#cancel), 0 for a reply without
	// one: a delayd from before the codes, or not delayd's reply.
	Status int
	// Reply is the reply's body, as delayd sent it: "error: " and the
	// reason for an error answer.
	Reply string
	// op is opReschedule for a [Reschedule]'s error, whose code 400 is a
	// bad delay unless the id is ambiguous.
	op string
}

// opReschedule is the op of a [*CancelError] of [Reschedule].
const opReschedule = "reschedule"

// ambiguousPrefix starts the reply of a cancel or reschedule whose id is
// ambiguous (code 400).
const ambiguousPrefix = contract.CancelReplyErrorPrefix + "ambiguous id"

// badDelay reports whether e is a reschedule's 400 answer for its delay
// (any 400 answer of it but an ambiguous id).
func (e *CancelError) badDelay() bool {
	return e.op == opReschedule && e.Status == contract.CancelStatusBadRequest && !strings.HasPrefix(e.Reply, ambiguousPrefix)
}

// Error returns "delayd: unexpected cancel reply: " and the quoted reply,
// the text these errors have always had.
func (e *CancelError) Error() string { return fmt.Sprintf("%v: %q", ErrCancelReply, e.Reply) }

// Is reports whether target is [ErrCancelReply] or the sentinel of e's
// Status.
func (e *CancelError) Is(target error) bool {
	switch target {
	case ErrCancelReply:
		return true
	case ErrAmbiguousID:
		return e.Status == contract.CancelStatusBadRequest && !e.badDelay()
	case ErrInvalidDelay:
		return e.badDelay()
	case ErrRouterBehind:
		return e.Status == contract.CancelStatusRouterBehind
	case ErrCancelBusy:
		return e.Status == contract.CancelStatusBusy
	case ErrCancelFailed:
		switch e.Status {
		case 0, contract.CancelStatusBadRequest, contract.CancelStatusRouterBehind, contract.CancelStatusBusy:
			return false
		}
		return true
	}
	return false
}

// PrefixDefault is delayd's default ingress subject prefix (DELAYD_PREFIX),
// "delay".
const PrefixDefault = contract.PrefixDefault

// PublishOpt is an option of [Publish].
type PublishOpt func(*publishOpts) error

type publishOpts struct {
	level    int
	hasLevel bool
	delay    string // HeaderDuration or HeaderDeliverAt value
	delayKey string
	nDelays  int
	msgID    string
	mergeKey string
	prefix   string
	prefixed bool // WithPrefix given
	require  bool // WithRequireInfo given
	header   nats.Header
}

// WithLevel sets the delay level: 1..N index delayd's level table, 0
// delivers at once, above N is clamped to level N by delayd (RocketMQ
// semantics), so [Publish] accepts it too. Negative is an error wrapping
// [ErrInvalidLevel].
func WithLevel(n int) PublishOpt {
	return func(o *publishOpts) error {
		if n < 0 {
			return fmt.Errorf("%w: %d is negative", ErrInvalidLevel, n)
		}
		o.level, o.hasLevel = n, true
		o.nDelays++
		return nil
	}
}

// WithDuration asks for delivery after d (>= 0; 0 is at once), cascading
// through delayd's levels. Negative is an error wrapping [ErrInvalidDelay].
func WithDuration(d time.Duration) PublishOpt {
	return func(o *publishOpts) error {
		if d < 0 {
			return fmt.Errorf("%w: duration %s is negative", ErrInvalidDelay, d)
		}
		o.delayKey, o.delay = HeaderDuration, d.String()
		o.nDelays++
		return nil
	}
}

// WithDeliverAt asks for delivery at t; a time in the past delivers at once.
func WithDeliverAt(t time.Time) PublishOpt {
	return func(o *publishOpts) error {
		o.delayKey, o.delay = HeaderDeliverAt, t.UTC().Format(time.RFC3339Nano)
		o.nDelays++
		return nil
	}
}

// WithMsgID sets the message's Nats-Msg-Id: it dedupes at ingress within the
// ingress stream's duplicate window ([contract.DuplicateWindow], 2 min) and
// is kept on delivery. A publish with an id the ingress stream stored
// within the window stores nothing and fails with a [*DuplicateError]
// ([ErrDuplicate]), even if that message was cancelled or delivered: to
// send a new message, use a new id.
func WithMsgID(id string) PublishOpt {
	return func(o *publishOpts) error {
		o.msgID = id
		return nil
	}
}

// WithMergeKey sets Delay-Merge-Key: while a message with this key and the
// same target is pending, this one is merged into it (delivered once, at the
// first one's due time, with the first one's payload). An empty or blank
// key is an error wrapping [ErrInvalidMergeKey].
func WithMergeKey(key string) PublishOpt {
	return func(o *publishOpts) error {
		if strings.TrimSpace(key) == "" {
			return fmt.Errorf("%w: empty", ErrInvalidMergeKey)
		}
		o.mergeKey = key
		return nil
	}
}

// WithPrefix sets delayd's ingress prefix when DELAYD_PREFIX is not "delay".
// Without it, [Publish] uses the running delayd's prefix (its [Info]), or
// "delay" when no delayd answers. A prefix other than the running delayd's
// is an error wrapping [ErrPrefixMismatch].
func WithPrefix(prefix string) PublishOpt {
	return func(o *publishOpts) error {
		o.prefix, o.prefixed = prefix, true
		return nil
	}
}

// WithRequireInfo makes [Publish] fail with [ErrNoInfo] when no delayd
// answers its info API, instead of publishing with the checks that need no
// configuration only.
func WithRequireInfo() PublishOpt {
	return func(o *publishOpts) error {
		o.require = true
		return nil
	}
}

// WithHeader adds user headers; delayd delivers them unchanged.
func WithHeader(h nats.Header) PublishOpt {
	return func(o *publishOpts) error {
		o.header = h
		return nil
	}
}

// Publish publishes data for delayed delivery to subject (the target, e.g.
// "orders.close") and waits for the ingress stream's PubAck, so the message
// is durably stored when it returns. It returns the message's id: the
// Nats-Msg-Id given with [WithMsgID], or else the ingress stream sequence
// as decimal text.
//
// Publish checks the message the way the running delayd's router will, so
// a message it accepts is never dead-lettered for a limit. It asks delayd
// once per connection and [InfoTTL] for its [Info] (a request on
// [InfoSubject], at most 2 s) and checks the target against the prefix and
// the target policy, a duration or deliver-at time against the max delay,
// and the size against the max payload less delayd's header reserve. A
// level above the table is accepted: delayd clamps it to the highest level.
// When no delayd answers (publishing while delayd is down is legitimate:
// the ingress stream keeps the message), only the checks that need no
// configuration are made (the delay options, the target's syntax and the
// subjects no delayd accepts), unless [WithRequireInfo] is given. A
// Delay-Deliver-At time is checked against this process's clock, so one
// within the clock offset from the server of the max delay may still be
// dead-lettered.
//
// Errors: [ErrNoDelay], [ErrAmbiguousDelay], [ErrInvalidLevel],
// [ErrInvalidDelay] or [ErrInvalidMergeKey] for the options, and
// [ErrInvalidDelay] for a delay beyond delayd's max delay; errors wrapping
// [ErrInvalidTarget], [ErrForbiddenTarget] or [ErrDeniedTarget] for a
// target delayd would refuse: empty or with
// empty tokens (the server stores no such subject, so it would never reach
// delayd), or one delayd would dead-letter (wildcards, '$' subjects,
// subjects under the prefix or under "delayd.", refused by the target
// policy); [ErrTooLarge];
// [ErrPrefixMismatch]; [ErrNoInfo] with [WithRequireInfo]; a
// [*DuplicateError], matching [ErrDuplicate], when the ingress stream
// dropped the message as a duplicate of one it stored with the same
// [WithMsgID] within its duplicate window (nothing was stored; see
// DuplicateError for the two causes); JetStream's publish errors.
func Publish(ctx context.Context, js jetstream.JetStream, subject string, data []byte, opts ...PublishOpt) (string, error) {
	o := publishOpts{prefix: PrefixDefault}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return "", err
		}
	}
	switch {
	case o.nDelays == 0:
		return "", ErrNoDelay
	case o.nDelays > 1:
		return "", ErrAmbiguousDelay
	}
	// The checks that need no configuration first: they fail without a
	// round trip.
	if err := contract.ValidateTarget(subject, o.prefix); err != nil {
		return "", fmt.Errorf("delayd: %w", err)
	}
	info, err := connInfo(ctx, js.Conn())
	switch {
	case err == nil:
		if o.prefixed && o.prefix != info.Prefix {
			return "", fmt.Errorf("%w: %q, delayd's is %q", ErrPrefixMismatch, o.prefix, info.Prefix)
		}
		o.prefix = info.Prefix
		if err := contract.ValidateTarget(subject, o.prefix); err != nil {
			return "", fmt.Errorf("delayd: %w", err)
		}
	case ctx.Err() != nil:
		return "", err
	case o.require:
		return "", fmt.Errorf("%w: %w", ErrNoInfo, err)
	}
	m := nats.NewMsg(o.prefix + "." + subject)
	m.Data = data
	for k, v := range o.header {
		if contract.IsDelayHeader(k) || (o.mergeKey != "" && strings.EqualFold(k, HeaderMergeKey)) {
			continue // the delay is the options'; a second one would be invalid
		}
		m.Header[k] = append([]string(nil), v...)
	}
	if o.hasLevel {
		m.Header.Set(HeaderLevel, strconv.Itoa(o.level))
	} else {
		m.Header.Set(o.delayKey, o.delay)
	}
	if o.mergeKey != "" {
		m.Header.Set(HeaderMergeKey, o.mergeKey)
	}
	if info != nil {
		delay := time.Duration(-1) // a level: clamped, never too long
		switch o.delayKey {
		case HeaderDuration:
			delay, _ = time.ParseDuration(o.delay)
		case HeaderDeliverAt:
			at, _ := time.Parse(time.RFC3339Nano, o.delay)
			delay = time.Until(at)
		}
		if o.hasLevel {
			delay = -1
		}
		if err := checkLimits(info, subject, m, o.msgID, delay, fmt.Sprintf("%s %q", o.delayKey, o.delay), ErrInvalidDelay); err != nil {
			return "", err
		}
	}
	ack, err := publishMsg(ctx, js, m, o.msgID)
	var dup *DuplicateError
	switch {
	case errors.As(err, &dup):
		return "", err
	case err != nil:
		return "", fmt.Errorf("delayd: publish: %w", err)
	case o.msgID != "":
		return o.msgID, nil
	}
	return strconv.FormatUint(ack.Sequence, 10), nil
}

// publishMsg publishes m through JetStream, with Nats-Msg-Id id unless id
// is empty, and waits for its PubAck. A PubAck that says the stream
// dropped m as a duplicate is a [*DuplicateError], returned with the ack:
// the one way this package's publishes learn of a duplicate ([Publish]
// returns it, [Retry] reports it in its result).
func publishMsg(ctx context.Context, js jetstream.JetStream, m *nats.Msg, id string) (*jetstream.PubAck, error) {
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ack, err := js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return nil, err
	}
	if ack.Duplicate {
		// id is empty for a Nats-Msg-Id header a caller set itself.
		return ack, &DuplicateError{ID: cmp.Or(id, headerFold(m.Header, contract.HeaderNatsMsgID)), Stream: ack.Stream,
			Sequence: ack.Sequence, Window: contract.DuplicateWindow}
	}
	return ack, nil
}

// checkLimits checks m (before its Nats-Msg-Id msgID is set), published
// with the given delay (negative: a Delay-Level, which delayd clamps), for
// target against the limits of the running delayd's configuration, as its
// router would. what names the delay in errors.
func checkLimits(info *Info, target string, m *nats.Msg, msgID string, delay time.Duration, what string, errDelay error) error {
	policy := contract.TargetPolicy{Allow: info.AllowTargets, Deny: info.DenyTargets}
	if err := policy.Check(target); err != nil {
		return fmt.Errorf("delayd: %w (DELAYD_ALLOW_TARGETS, DELAYD_DENY_TARGETS)", err)
	}
	if maxDelay := time.Duration(info.MaxDelayNS); maxDelay > 0 && delay > maxDelay {
		return fmt.Errorf("%w: %s is beyond the longest delay %s of the running delayd (DELAYD_MAX_DELAY)", errDelay, what, info.MaxDelay)
	}
	size := len(m.Data) + len("NATS/1.0\r\n\r\n")
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(": \r\n") + len(v)
		}
	}
	if msgID != "" {
		size += len(jetstream.MsgIDHeader) + len(": \r\n") + len(msgID)
	}
	if limit := info.MaxPayload - int64(info.HeaderReserve); info.MaxPayload > 0 && int64(size) > limit {
		return fmt.Errorf("%w: %d bytes of headers and payload, the running delayd takes at most %d (the server's max payload %d less %d for delayd's own headers)", ErrTooLarge, size, limit, info.MaxPayload, info.HeaderReserve)
	}
	return nil
}
