package jswire

import (
	"context"
	"time"
)

// OpTimeout bounds one JetStream API call or publish of delayd's (stream
// info, a direct get, a KV read, a PubAck wait).
const OpTimeout = 10 * time.Second

// OpContext returns ctx bounded by [OpTimeout].
func OpContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, OpTimeout)
}

// WriteAttempt bounds one copy of a write to a stream whose answer only
// the stream's leader gives: the router's level and dead-letter writes and
// id index writes (index.Group), dead letters (message.PublishDeadLetter),
// and a scanner's deliveries to stream-bound targets and hop forwards. A
// leader that hangs (SIGSTOP, a stalled disk, a half-open network) never
// answers; JetStream elects a new one in about 5-8 s, and a copy not
// answered within WriteAttempt is sent again (the router after a resync of
// the level's tail, a scanner after a rewind, the others at once, the same
// bytes), so it reaches the new
// leader within WriteAttempt of the election instead of waiting out
// the publish-async timeout. A copy sent again cannot double or regress
// anything: level writes carry Nats-Expected-Last-Sequence, hop forwards
// and deliveries and dead letters a Nats-Msg-Id, offset commits are
// compare-and-sets, and a copy of an index write holds the same records
// (docs/design.md#re-sent-writes-to-a-hung-leader).
const WriteAttempt = 2 * time.Second
