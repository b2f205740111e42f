package contract

import "time"

// The status API (NATS request/reply): like the cancel API, but it only
// tells, it cancels nothing. The request's payload is a message id, as for
// a cancel; the reply's body is exactly one of [StatusReplyPending],
// [CancelReplyCancelled], [CancelReplyDelivered], [CancelReplyNotFound],
// or [CancelReplyErrorPrefix] and a one-line reason, with the cancel API's
// [HeaderStatus] codes and [StatusPending] for pending. A pending reply
// carries the message's delivery time in [HeaderDueAt] ([TimeLayout]).
const (
	// StatusSubject is the unscoped status API, the operator's form: the
	// request's payload is a message id of any target. Publishers use the
	// scoped form [StatusSubjectFor].
	StatusSubject = InternalPrefix + ".api.status"

	// StatusReplyPending: the message is neither handed to its target nor
	// cancelled; [HeaderDueAt] is when it is due. It is a snapshot: the
	// message may be delivered or cancelled right after.
	StatusReplyPending = "pending"

	// StatusPending is the code of [StatusReplyPending], like HTTP's 202
	// Accepted: taken, not acted upon yet.
	StatusPending = 202
)

// StatusSubjectFor returns the scoped status API subject of target,
// "delayd.api.status.<target>": a request there tells only of a message
// whose target subject is target, and answers "not found" for any other,
// as [CancelSubjectFor] does.
func StatusSubjectFor(target string) string { return StatusSubject + "." + target }

// Kept answers (DELAYD_ANSWER_KEEP, DELAYD_ANSWER_MAX_BYTES): how long, and
// within how many bytes, delayd keeps a message's final answer ("already
// delivered" or "cancelled") for cancel and status once its id index
// records are trimmed (docs/guide.md#kept-answers).
const (
	// AnswerKeepDefault is DELAYD_ANSWER_KEEP's default: 6 hours.
	AnswerKeepDefault = 6 * time.Hour
	// AnswerKeepMin and AnswerKeepMax bound DELAYD_ANSWER_KEEP.
	AnswerKeepMin = time.Second
	AnswerKeepMax = 30 * 24 * time.Hour

	// AnswerMaxBytesDefault is DELAYD_ANSWER_MAX_BYTES's default: 256 MiB on disk, about 2.3 million answers and
	// 0.5 to 0.75 GB of the NATS server's memory (docs/guarantees.md#what-kept-answers-cost).
	AnswerMaxBytesDefault = 256 << 20
	// AnswerMaxBytesMin is DELAYD_ANSWER_MAX_BYTES's least value: 1 MiB.
	AnswerMaxBytesMin = 1 << 20
)
