package deliver

import (
	"errors"

	"github.com/delayd/delayd/deliver/internal/cancelapi"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// Sentinel errors of the package. Returned errors wrap one of these (or one
// of [contract.ErrInvalidTarget], [contract.ErrForbiddenTarget],
// [contract.ErrDeniedTarget] and the levels package's Delay-Level errors),
// so match them with [errors.Is].
var (
	// ErrInvalidDelay means a message's Delay-Duration or Delay-Deliver-At
	// is invalid: not a Go duration or an RFC 3339 time, negative, beyond
	// the max delay (DELAYD_MAX_DELAY), given more than once, or given with
	// another delay header. Such a message is dead-lettered with reason
	// "level". Its text is "invalid delay level", the text those dead
	// letters' Delay-Error has always started with; it is kept so that
	// Delay-Error does not change.
	ErrInvalidDelay = message.ErrInvalidDelay

	// ErrInvalidMergeKey means a message's Delay-Merge-Key is empty or has
	// more than one value. Such a message is dead-lettered with reason
	// "level"; its text is "invalid delay level" for the same reason as
	// [ErrInvalidDelay].
	ErrInvalidMergeKey = message.ErrInvalidMergeKey

	// ErrTooLarge means a message no longer fits the server's max payload
	// once delayd's own headers are added. Such a message is dead-lettered
	// with reason "size".
	ErrTooLarge = message.ErrTooLarge

	// ErrPermissionDenied means the server refused delayd's publish to the
	// target: delayd's NATS user may not publish there.
	ErrPermissionDenied = message.ErrPermissionDenied

	// ErrHopKey is wrapped by the error [Service.Run] returns when the hop
	// secret stored in the offsets bucket is not one delayd wrote: wrong
	// length, unknown format or failed integrity check. It is not retried:
	// running on with another secret would change every derived delivery id.
	ErrHopKey = hop.ErrKey

	// ErrReplicaMismatch is wrapped by the error [Service.Run] returns
	// at start when a live replica (another delayd process on the same
	// account) runs with a different level table, prefix or stream
	// replica count: the error names the variable (DELAYD_LEVELS,
	// DELAYD_PREFIX, DELAYD_REPLICAS), both values and the replica. It is
	// not retried, and nothing was created or changed. A replica is live
	// while it renews its membership key in DELAYD_LEASES; one that
	// stopped gracefully deleted it, and one that crashed counts as
	// stopped once its key is seen unchanged for the lease TTL.
	ErrReplicaMismatch = errors.New("configuration differs from a live replica's")

	// ErrIngressPartitionsChanged is wrapped by the error [Service.Run]
	// returns at start when DELAYD_INGRESS_PARTITIONS differs from the
	// count DELAYD_INGRESS's subject transform was set up with while the
	// stream still holds messages: they were stored under the old count's
	// subjects, which the new count's routers do not read, so changing it
	// then could strand or reorder them. The error names the variable,
	// both counts and how many messages wait. It is not retried and nothing
	// was changed: start with the old count until the stream is empty
	// (stop the publishers, let the routers drain it), then change it
	// (docs/operations.md#ingress-partitions).
	ErrIngressPartitionsChanged = resource.ErrIngressPartitionsChanged

	// ErrReplicasUnsupported is wrapped by the error [Service.Run] returns
	// at start when the server refuses a stream or bucket of more than one
	// replica because it is not clustered (JetStream error 10074): the
	// error names DELAYD_REPLICAS and its value. It is not retried.
	ErrReplicasUnsupported = errors.New("the NATS server is not clustered: replicas > 1 not supported")

	// ErrRouterBehind is a cancel's error when the router has not placed the
	// messages published before it within 25 s: the answer is not known yet.
	// The request may be sent again. The cancel API answers it with code
	// [contract.CancelStatusRouterBehind].
	ErrRouterBehind = cancelapi.ErrRouterBehind

	// ErrAmbiguousID is a cancel's error for a decimal id that is both a
	// publisher's Nats-Msg-Id and an ingress sequence delayd knows: "seq:N"
	// or "id:N" says which. The cancel API answers it with code
	// [contract.CancelStatusBadRequest].
	ErrAmbiguousID = cancelapi.ErrAmbiguousID

	// ErrCancelBusy is the cancel API's answer (code 429,
	// [contract.CancelStatusBusy]) to a request that arrives while
	// [CancelQueueMax] requests already wait: it is answered at once,
	// not looked at, so a storm of cancels gets prompt answers instead of
	// timeouts and costs the deliveries nothing. Try again after a pause.
	ErrCancelBusy = level.ErrCancelBusy
)
