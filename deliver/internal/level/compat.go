package level

// compat.go holds the unexported aliases that keep the level owner's files,
// moved from deliver in step L1, compiling as they were
// (docs/reshape.md#6-steps-in-order, L1; deliver/compat.go is the same for
// deliver). It goes when the names are used directly (L4, F1).

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ibackoff "github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// backoff: deliver/internal/backoff.
type backoff = ibackoff.Backoff

func newBackoff(min, max time.Duration) *backoff { return ibackoff.New(min, max) }

const (
	opTimeout    = jswire.OpTimeout
	writeAttempt = jswire.WriteAttempt
	cancelStream = index.CancelStream
)

// The level message and the dead letter: deliver/internal/message.
const (
	hdrMsgID      = message.HdrMsgID
	hdrIngress    = message.HdrIngress
	hdrOrigin     = message.HdrOrigin
	hdrHops       = message.HdrHops
	hdrHopDue     = message.HdrHopDue
	hdrMerge      = message.HdrMerge
	hdrPartKey    = message.HdrPartKey
	hdrJSSubject  = message.HdrJSSubject
	hdrJSSequence = message.HdrJSSequence
)

var (
	errTooLarge         = message.ErrTooLarge
	errPermissionDenied = message.ErrPermissionDenied
)

type (
	reasonCounts = message.ReasonCounts
	dlqRefusals  = message.Refusals
)

// Functions are wrappers, not func values: a direct call inlines and keeps
// escape analysis as it was.
func parseTime(v string) (time.Time, error)           { return message.ParseTime(v) }
func levelKey(h nats.Header) string                   { return message.LevelKey(h) }
func reasonOf(err error) string                       { return message.ReasonOf(err) }
func tooLarge(err error) bool                         { return message.TooLarge(err) }
func stripInternal(h nats.Header)                     { message.StripInternal(h) }
func levelDue(h nats.Header) (due time.Time, ok bool) { return message.LevelDue(h) }
func isMarker(subject string) bool                    { return message.IsMarker(subject) }
func deadLetterMsg(subject string, h nats.Header, data []byte, reason error, id string) *nats.Msg {
	return message.DeadLetterMsg(subject, h, data, reason, id)
}
func publishDeadLetter(ctx context.Context, js jetstream.JetStream, dl *nats.Msg) error {
	return message.PublishDeadLetter(ctx, js, dl)
}
func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	return jswire.StreamInfo(ctx, js, name)
}

// The hop secret: deliver/internal/hop.
type (
	hopKey = hop.Key
	idMAC  = hop.IDMAC
)

const hopKeySize = hop.KeySize

// A level owner's answers (asker.go).
type cancelAnswer = CancelAnswer

const (
	answerCancelled = AnswerCancelled
	answerDelivered = AnswerDelivered
	answerForwarded = AnswerForwarded
	answerGone      = AnswerGone
	answerRetry     = AnswerRetry
	answerPending   = AnswerPending
)

var errNoOwner = ErrNoOwner

// errNotOwner stops a scanner or the router whose lease term ended (or
// whose offset commit was fenced): another replica owns the work now
// (deliver/internal/ownership, shared with the router).
var errNotOwner = ownership.ErrNotOwner
