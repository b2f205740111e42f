package deliver

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/levels"
)

// ErrTooLarge means a message no longer fits the server's max payload once
// delayd's own headers are added.
var ErrTooLarge = errors.New("message too large")

// DLQ subjects and stream.
const (
	// DLQStream holds invalid and undeliverable messages.
	DLQStream = "DELAYD_DLQ"
	// DLQSubjectPrefix is followed by the reason: "delayd.dlq.level".
	DLQSubjectPrefix = dlqSubjects
)

// reasonOf maps an error to its dead-letter reason.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, ErrInvalidTarget), errors.Is(err, ErrForbiddenTarget):
		return ReasonTarget
	case errors.Is(err, levels.ErrMissingLevel), errors.Is(err, levels.ErrInvalidLevel), errors.Is(err, levels.ErrLevelOverflow):
		return ReasonLevel
	case errors.Is(err, ErrTooLarge):
		return ReasonSize
	}
	return ReasonUndeliverable
}

// deadLetterMsg builds the DLQ message for a message published to subject.
// It keeps the payload and headers, except JetStream instruction headers
// (Nats-*), which would act on the dead-letter stream; a publisher's
// Nats-Msg-Id is kept as Delay-Msg-Id. It adds Delay-Error and
// Delay-Subject, and dedupes on id, the message's derived ingress id.
func deadLetterMsg(subject string, h nats.Header, data []byte, reason error, id string) *nats.Msg {
	if h == nil {
		h = make(nats.Header, 4)
	}
	for k, v := range h {
		if hasPrefixFold(k, "Nats-") {
			if k == HeaderNatsMsgID && len(v) > 0 {
				h[HeaderMsgID] = []string{v[0]}
			}
			delete(h, k)
		}
	}
	h[HeaderError] = []string{oneLine(reason.Error())}
	h[HeaderSubject] = []string{subject}
	h[HeaderNatsMsgID] = []string{id}
	return &nats.Msg{Subject: dlqSubjects + reasonOf(reason), Header: h, Data: data}
}

// oneLine makes s safe as a header value.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}
