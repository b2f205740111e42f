package contract

import (
	"encoding/json"
	"time"
)

// The list API (docs/guide.md#pending-messages): a request to
// [PendingSubjectFor](target) answers a [PendingReply] as JSON, the
// messages pending for exactly that target, in due order, a page at a
// time. Its errors are the cancel API's: a body of
// [CancelReplyErrorPrefix] and a reason, with the code in [HeaderStatus]
// (400 for a request that cannot be answered as sent, 429, 500, 503).
const (
	// PendingSubject is the root of the list API's subjects, and the
	// operator form's subject: a request there lists across targets, those
	// matching [PendingRequest].Subject (grant it to operators only, as
	// the unscoped [CancelSubject]).
	PendingSubject = InternalPrefix + ".api.pending"

	// PendingLimitDefault is the page size of a request that gives no
	// limit.
	PendingLimitDefault = 100
	// PendingLimitMax is the largest limit a request may give; a larger
	// one is answered 400.
	PendingLimitMax = 1000
	// PendingStatusOK is the code of a list answer ([HeaderStatus]).
	PendingStatusOK = 200
)

// PendingSubjectFor returns the list API subject of target,
// "delayd.api.pending.<target>": a request there lists only messages
// whose target subject is target, so a NATS user allowed to publish to
// "delayd.api.pending.orders.>" can list only messages bound for orders.>.
func PendingSubjectFor(target string) string { return PendingSubject + "." + target }

// PendingRequest is a list request's payload, as JSON; an empty payload
// is the zero request (the first page, [PendingLimitDefault] items, no
// filter, no payloads).
type PendingRequest struct {
	// Limit is the most items of the page: 0 is [PendingLimitDefault],
	// above [PendingLimitMax] is refused.
	Limit int `json:"limit,omitempty"`
	// Cursor is the previous page's [PendingReply].Next: the page after
	// it. Opaque; send it with the same filter.
	Cursor string `json:"cursor,omitempty"`
	// DueAfter and DueBefore, if set, are exclusive bounds on an item's
	// due.
	DueAfter  time.Time `json:"due_after,omitzero"`
	DueBefore time.Time `json:"due_before,omitzero"`
	// Payload asks for each item's payload ([PendingItem].Data).
	Payload bool `json:"payload,omitempty"`
	// Subject is the operator form's filter (a request to
	// [PendingSubject] itself): the targets it lists, a subject with
	// wildcards; "" is ">", every target. The scoped form refuses it.
	Subject string `json:"subject,omitempty"`
}

// PendingReply is a list answer: a page of the target's pending messages,
// in due order (ties by id).
type PendingReply struct {
	// Target is the scoped form's target; "" in the operator form.
	Target string `json:"target,omitempty"`
	// Subject is the operator form's subject filter; "" in the scoped
	// form.
	Subject string        `json:"subject,omitempty"`
	Items   []PendingItem `json:"items"`
	// Total and NextDue are on the first page only (a request without a
	// cursor), and ignore the due filter: how many messages are pending
	// for the target (or the subject), and the least due among them
	// (zero when none). Total may count a message cancelled by a
	// tombstone the walk did not read, until its level passes it
	// (docs/pending.md#14-request-and-answer).
	Total   *int      `json:"total,omitempty"`
	NextDue time.Time `json:"next_due,omitzero"`
	// Next is the cursor of the next page ([PendingRequest].Cursor); ""
	// when this page is the last. A page may hold fewer items than the
	// limit and still have a next one (its reply reached the size bound,
	// or items read for it were delivered or cancelled meanwhile).
	Next string `json:"next,omitempty"`
}

// MarshalJSON writes it with NextDue in [TimeLayout], as the items'
// times are.
func (r PendingReply) MarshalJSON() ([]byte, error) {
	out := struct {
		Target  string        `json:"target,omitempty"`
		Subject string        `json:"subject,omitempty"`
		Total   *int          `json:"total,omitempty"`
		NextDue string        `json:"next_due,omitempty"`
		Items   []PendingItem `json:"items"`
		Next    string        `json:"next,omitempty"`
	}{Target: r.Target, Subject: r.Subject, Total: r.Total, Items: r.Items, Next: r.Next}
	if !r.NextDue.IsZero() {
		out.NextDue = FormatTime(r.NextDue)
	}
	return json.Marshal(out)
}

// PendingItem is one pending message of a [PendingReply].
type PendingItem struct {
	// ID is the id cancel and status accept: the publisher's Nats-Msg-Id,
	// else "seq:<ingress sequence>". A publisher's id cancel would also
	// read as something else (decimal, "seq:"/"id:" prefixed, a delivered
	// id) is "id:<the id>". An id ending in white space is given as
	// stored; cancel trims its id and cannot name it.
	ID string `json:"id"`
	// Due is when it will be delivered (not its next cascade hop): its
	// Delay-Due-At. In JSON both times are written as the headers are
	// ([TimeLayout]: UTC, nine fraction digits).
	Due time.Time `json:"due"`
	// Enqueued is when delayd first stored it (Delay-Enqueued-At).
	Enqueued time.Time `json:"enqueued,omitzero"`
	Target   string    `json:"target"`
	// Level is the level it waits in now, Stream and Seq its place there.
	Level  string `json:"level"`
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	// Hops is how many times it cascaded to a shorter level so far.
	Hops int `json:"hops,omitempty"`
	// Size is the payload's size in bytes.
	Size     int    `json:"size"`
	MergeKey string `json:"merge_key,omitempty"`
	// Headers are the publisher's headers as the target will receive
	// them, without delayd's and JetStream's own.
	Headers map[string][]string `json:"headers,omitempty"`
	// Data is the payload (base64 in JSON), only when the request asked
	// for it.
	Data []byte `json:"data,omitempty"`
}

// MarshalJSON writes it with Due and Enqueued in [TimeLayout], as the
// Delay-Due-At and Delay-Enqueued-At headers are (encoding/json's own
// RFC 3339 drops trailing zero fraction digits). Decoding needs nothing
// of its own: [TimeLayout] is RFC 3339.
func (it PendingItem) MarshalJSON() ([]byte, error) {
	out := struct {
		ID       string              `json:"id"`
		Due      string              `json:"due"`
		Enqueued string              `json:"enqueued,omitempty"`
		Target   string              `json:"target"`
		Level    string              `json:"level"`
		Stream   string              `json:"stream"`
		Seq      uint64              `json:"seq"`
		Hops     int                 `json:"hops,omitempty"`
		Size     int                 `json:"size"`
		MergeKey string              `json:"merge_key,omitempty"`
		Headers  map[string][]string `json:"headers,omitempty"`
		Data     []byte              `json:"data,omitempty"`
	}{it.ID, FormatTime(it.Due), "", it.Target, it.Level, it.Stream, it.Seq, it.Hops, it.Size, it.MergeKey, it.Headers, it.Data}
	if !it.Enqueued.IsZero() {
		out.Enqueued = FormatTime(it.Enqueued)
	}
	return json.Marshal(out)
}

// The cancel-all API (docs/guide.md#cancel-everything-pending-for-a-target):
// a request to [CancelAllSubjectFor](target) cancels every message pending
// for target that was published before the request, and answers a
// [CancelAllReply] as JSON with [CancelAllStatusOK]. Its errors are the
// cancel API's, as the list API's are.
const (
	// CancelAllSubject is the root of the cancel-all API's subjects. Only
	// the scoped form [CancelAllSubjectFor] is served. It is not under
	// [CancelSubject]: "delayd.api.cancel.all.x" is a cancel of the target
	// "all.x", and a subject of its own lets a permission grant single
	// cancels without granting cancel-all.
	CancelAllSubject = InternalPrefix + ".api.cancelall"
	// CancelAllStatusOK is the code of a cancel-all answer ([HeaderStatus]).
	CancelAllStatusOK = 200
)

// CancelAllSubjectFor returns the cancel-all API subject of target,
// "delayd.api.cancelall.<target>": a request there cancels only messages
// whose target subject is target, so a NATS user allowed to publish to
// "delayd.api.cancelall.orders.>" can cancel only messages bound for
// orders.>.
func CancelAllSubjectFor(target string) string { return CancelAllSubject + "." + target }

// CancelAllReply is a cancel-all answer.
type CancelAllReply struct {
	// Cancelled is how many messages this request cancelled: each one its
	// level owner's "cancelled" answer, so none of them is delivered.
	Cancelled int `json:"cancelled"`
	// AlreadyDelivered is how many messages pending when the request read
	// them were delivered before their owner decided.
	AlreadyDelivered int `json:"already_delivered"`
	// Complete is false when the request's budget ran out before every
	// message was decided: send it again (what is cancelled stays
	// cancelled and is not counted again).
	Complete bool `json:"complete"`
}

// The reschedule API (docs/pending.md#2-reschedule): a request to
// [RescheduleSubjectFor](target), with the id as its payload and the new
// delay as a publisher gives one ([HeaderLevel], [HeaderDuration] or
// [HeaderDeliverAt] on the request), moves that pending message to its
// new due. It answers exactly one of [RescheduleReplyRescheduled] (with
// the new due in [HeaderDueAt]), [CancelReplyNotFound] or
// [CancelReplyDelivered], with the cancel API's codes in [HeaderStatus]
// ([RescheduleStatusRescheduled], [CancelStatusNotFound],
// [CancelStatusDelivered]); its errors are the cancel API's. A
// rescheduled message keeps its id, payload and user headers, and is
// delivered once, never before its new due and never at its old one.
const (
	// RescheduleSubject is the root of the reschedule API's subjects.
	RescheduleSubject = InternalPrefix + ".api.reschedule"
	// RescheduleReplyRescheduled: the message was pending and is now
	// delivered at the new due (and only then), given in [HeaderDueAt].
	RescheduleReplyRescheduled = "rescheduled"
	// RescheduleStatusRescheduled is the code of
	// [RescheduleReplyRescheduled].
	RescheduleStatusRescheduled = 200
	// HeaderRescheduled is set on the delivery of a message that was
	// rescheduled: how many times it was ("Delay-Rescheduled: 1"), as
	// [HeaderHops] counts its cascade hops.
	HeaderRescheduled = "Delay-Rescheduled"
)

// RescheduleSubjectFor returns the reschedule API subject of target,
// "delayd.api.reschedule.<target>": a request there moves only a message
// whose target subject is target, so a NATS user allowed to publish to
// "delayd.api.reschedule.orders.>" can move only messages bound for
// orders.>.
func RescheduleSubjectFor(target string) string { return RescheduleSubject + "." + target }
