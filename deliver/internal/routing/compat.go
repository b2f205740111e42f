package routing

// compat.go holds the unexported aliases that keep the router's files,
// moved from deliver in step R1, compiling as they were
// (docs/reshape.md#6-steps-in-order, R1; deliver/compat.go and
// deliver/internal/level/compat.go are the same for deliver and level). It
// goes when the names are used directly (R3, F1).

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	ibackoff "github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// backoff: deliver/internal/backoff.
type backoff = ibackoff.Backoff

func newBackoff(min, max time.Duration) *backoff { return ibackoff.New(min, max) }

const (
	opTimeout    = jswire.OpTimeout
	writeAttempt = jswire.WriteAttempt
)

// Subject roots of the contract, short for this package's use.
const levelSubjects = contract.LevelSubjectPrefix // "delayd.level.<level name>.<target>"

// The level message and the dead letter: deliver/internal/message.
const (
	hdrMsgID       = message.HdrMsgID
	hdrIngress     = message.HdrIngress
	hdrOrigin      = message.HdrOrigin
	hdrHops        = message.HdrHops
	hdrHopDue      = message.HdrHopDue
	hdrMerge       = message.HdrMerge
	hdrPartKey     = message.HdrPartKey
	hdrRouterEpoch = message.HdrRouterEpoch
	hdrRouterTail  = message.HdrRouterTail
	hdrRouterLease = message.HdrRouterLease
	hdrJSSubject   = message.HdrJSSubject
	hdrJSSequence  = message.HdrJSSequence
	routerRefusal  = message.RouterRefusal
)

type (
	reasonCounts = message.ReasonCounts
	dlqRefusals  = message.Refusals
)

// Functions are wrappers, not func values: a direct call inlines and keeps
// escape analysis as it was.
func levelKey(h nats.Header) string                     { return message.LevelKey(h) }
func reasonOf(err error) string                         { return message.ReasonOf(err) }
func tooLarge(err error) bool                           { return message.TooLarge(err) }
func parseIngressRef(ref string) (string, uint64, bool) { return message.ParseIngressRef(ref) }
func deadLetterMsg(subject string, h nats.Header, data []byte, reason error, id string) *nats.Msg {
	return message.DeadLetterMsg(subject, h, data, reason, id)
}
func isMarker(subject string) bool { return message.IsMarker(subject) }
func publishDeadLetter(ctx context.Context, js jetstream.JetStream, dl *nats.Msg) error {
	return message.PublishDeadLetter(ctx, js, dl)
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	return jswire.StreamInfo(ctx, js, name)
}

// The hop secret: deliver/internal/hop.
type hopKey = hop.Key

const (
	hdrHopMac  = hop.HdrMac
	hopKeySize = hop.KeySize
)

// errNotOwner stops a router whose lease term ended: another replica
// routes now (deliver/internal/ownership, shared with the level owners).
var errNotOwner = ownership.ErrNotOwner

// The resources' names and the level stream's creation:
// deliver/internal/resource.
const ingressStream = resource.IngressStream

func ingressPartitionSubject(i int) string { return resource.IngressPartitionSubject(i) }
func ensureLevelStream(ctx context.Context, js jetstream.JetStream, name string, delay time.Duration, replicas int) error {
	return resource.EnsureLevelStream(ctx, js, name, delay, replicas)
}
