package contract

// Replies of the cancel API ([CancelSubject], [CancelSubjectFor]). The body
// is the answer's text, exactly one of these or [CancelReplyErrorPrefix]
// and a one-line reason; the reply's [HeaderStatus] carries its code.
const (
	// CancelReplyCancelled: the message was pending and is never delivered.
	CancelReplyCancelled = "cancelled"
	// CancelReplyNotFound: no pending or recently passed message has that
	// id and target.
	CancelReplyNotFound = "not found"
	// CancelReplyDelivered: the message was handed to its target before the
	// cancel was decided.
	CancelReplyDelivered = "already delivered"
	// CancelReplyErrorPrefix starts an error answer's body: "error: " and
	// the reason, e.g. "error: ambiguous id ...".
	CancelReplyErrorPrefix = "error: "
)

// Codes of the cancel API's answers, in [HeaderStatus] as decimal text.
// They follow HTTP's meanings; a client maps them back to errors without
// parsing the body.
const (
	// CancelStatusCancelled is the code of [CancelReplyCancelled].
	CancelStatusCancelled = 200
	// CancelStatusBadRequest is the code of an error answer for a request
	// that cannot be answered as sent: a decimal id that names two messages
	// (send "seq:N" or "id:X").
	CancelStatusBadRequest = 400
	// CancelStatusNotFound is the code of [CancelReplyNotFound].
	CancelStatusNotFound = 404
	// CancelStatusDelivered is the code of [CancelReplyDelivered]: too late,
	// the message was handed to its target.
	CancelStatusDelivered = 409
	// CancelStatusBusy is the code of the error answer given at once when
	// more cancel requests wait than delayd works through promptly (a
	// cancel storm): the request was not looked at; try again after a
	// pause. Like HTTP's 429 Too Many Requests.
	CancelStatusBusy = 429
	// CancelStatusError is the code of any other error answer: delayd could
	// not decide (a stream or KV operation failed); try again.
	CancelStatusError = 500
	// CancelStatusRouterBehind is the code of the error answer given when
	// the router has not yet placed every message published before the
	// cancel; try again.
	CancelStatusRouterBehind = 503
)
