package cancelapi

import (
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/level"
)

// replyMsg builds the cancel API's reply: body is the answer's text
// (one of the contract.CancelReply* texts, or "error: " and err's text), and
// the header [contract.HeaderStatus] its code, so a client tells the answers
// apart without parsing the body.
func replyMsg(body string, err error) *nats.Msg {
	return &nats.Msg{
		Data:   []byte(body),
		Header: nats.Header{contract.HeaderStatus: {strconv.Itoa(status(body, err))}},
	}
}

// status is the code of a cancel answer: body when err is nil, else
// err's.
func status(body string, err error) int {
	switch {
	case errors.Is(err, ErrRouterBehind):
		return contract.CancelStatusRouterBehind
	case errors.Is(err, level.ErrCancelBusy):
		return contract.CancelStatusBusy
	case errors.Is(err, ErrAmbiguousID):
		return contract.CancelStatusBadRequest
	case err != nil:
		return contract.CancelStatusError
	}
	switch body {
	case contract.CancelReplyCancelled:
		return contract.CancelStatusCancelled
	case contract.CancelReplyNotFound:
		return contract.CancelStatusNotFound
	case contract.CancelReplyDelivered:
		return contract.CancelStatusDelivered
	}
	return contract.CancelStatusError
}
