package deliver

// compat.go holds the unexported aliases that keep deliver's files compiling
// while their pieces move into the packages under deliver/internal
// (docs/reshape.md#6-steps-in-order, S1). It goes in step F1.

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ibackoff "github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// backoff: deliver/internal/backoff.
type backoff = ibackoff.Backoff

func newBackoff(min, max time.Duration) *backoff { return ibackoff.New(min, max) }

// opTimeout: deliver/internal/jswire.
const opTimeout = jswire.OpTimeout

// The level message and the dead letter: deliver/internal/message.
const (
	hdrInternalPrefix = message.HdrInternalPrefix
	hdrMsgID          = message.HdrMsgID
	hdrIngress        = message.HdrIngress
	hdrOrigin         = message.HdrOrigin
	hdrHops           = message.HdrHops
	hdrHopDue         = message.HdrHopDue
	hdrMerge          = message.HdrMerge
	hdrPartKey        = message.HdrPartKey
	hdrRouterEpoch    = message.HdrRouterEpoch
	hdrRouterTail     = message.HdrRouterTail
	hdrRouterLease    = message.HdrRouterLease
	hdrJSSubject      = message.HdrJSSubject
	hdrJSSequence     = message.HdrJSSequence
	hdrJSTimeStamp    = message.HdrJSTimeStamp
	routerRefusal     = message.RouterRefusal
)

type (
	reasonCounts = message.ReasonCounts
	dlqRefusals  = message.Refusals
)

// Functions are wrappers, not func values: a direct call inlines and keeps
// escape analysis as it was (parseTime, levelKey and stripInternal are on
// the delivery path).
func hasPrefixFold(s, prefix string) bool               { return message.HasPrefixFold(s, prefix) }
func parseTime(v string) (time.Time, error)             { return message.ParseTime(v) }
func levelKey(h nats.Header) string                     { return message.LevelKey(h) }
func reasonOf(err error) string                         { return message.ReasonOf(err) }
func oneLine(s string) string                           { return message.OneLine(s) }
func tooLarge(err error) bool                           { return message.TooLarge(err) }
func stripInternal(h nats.Header)                       { message.StripInternal(h) }
func parseIngressRef(ref string) (string, uint64, bool) { return message.ParseIngressRef(ref) }
func deadLetterMsg(subject string, h nats.Header, data []byte, reason error, id string) *nats.Msg {
	return message.DeadLetterMsg(subject, h, data, reason, id)
}
func publishDeadLetter(ctx context.Context, js jetstream.JetStream, dl *nats.Msg) error {
	return message.PublishDeadLetter(ctx, js, dl)
}

// The hop secret: deliver/internal/hop.
type (
	hopKey = hop.Key
	idMAC  = hop.IDMAC
)

const (
	hdrHopMac  = hop.HdrMac
	hopKeySize = hop.KeySize
)

func loadHopKey(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (hopKey, error) {
	return hop.Load(ctx, js, logger)
}

// A level owner's answers: deliver/internal/level (S2).
type cancelAnswer = level.CancelAnswer

const (
	answerCancelled = level.AnswerCancelled
	answerDelivered = level.AnswerDelivered
	answerForwarded = level.AnswerForwarded
	answerGone      = level.AnswerGone
	answerRetry     = level.AnswerRetry
	answerPending   = level.AnswerPending
)

var errNoOwner = level.ErrNoOwner

// errNotOwner: deliver/internal/ownership (L1), shared by the router and
// the level owners.
var errNotOwner = ownership.ErrNotOwner

// sleepCtx waits d, or until ctx is done (its error). It stayed with the
// scanner (level.sleepWake) in L1; the cancel paths' copy is here.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// The ingress partitions' subjects and the level streams' creation:
// deliver/internal/resource (K1).
func ingressPartitionSubject(i int) string         { return resource.IngressPartitionSubject(i) }
func ingressPartitionOf(subject string, n int) int { return resource.IngressPartitionOf(subject, n) }
func ensureLevelStream(ctx context.Context, js jetstream.JetStream, name string, delay time.Duration, replicas int) error {
	return resource.EnsureLevelStream(ctx, js, name, delay, replicas)
}

// resource keeps its own copies of these names; a difference fails to
// compile (a duplicate key false in the map literal).
var _ = map[bool]int{false: 0, IngressStream == resource.IngressStream && RouterConsumer == resource.RouterConsumer: 1}
