package contract

import (
	"strings"
	"time"
)

// Header names of the user-facing contract (docs/guide.md#publishing). NATS headers are
// case-sensitive on the wire; delayd matches the control headers
// case-insensitively, as the contract requires.
const (
	// HeaderLevel is the publisher's 1-based level index: "Delay-Level: 3".
	// It is a control header and never reaches the target.
	HeaderLevel = "Delay-Level"

	// HeaderEnqueuedAt is set on every delivery: the time the ingress stream
	// stored the message, RFC 3339 with nanoseconds, UTC.
	HeaderEnqueuedAt = "Delay-Enqueued-At"

	// HeaderDueAt is set on every delivery: HeaderEnqueuedAt plus the level's
	// delay, RFC 3339 with nanoseconds, UTC. Delivery never happens before it.
	HeaderDueAt = "Delay-Due-At"

	// HeaderDuration asks for any delay, as a Go duration: "Delay-Duration: 90s".
	// Exactly one of HeaderLevel, HeaderDuration and HeaderDeliverAt may be set.
	HeaderDuration = "Delay-Duration"

	// HeaderDeliverAt asks for delivery at a time, RFC 3339:
	// "Delay-Deliver-At: 2026-11-30T08:00:00Z". A time in the past is
	// delivered at once.
	HeaderDeliverAt = "Delay-Deliver-At"

	// HeaderHops is set on deliveries that cascaded through level streams:
	// how many times the message moved on to another level.
	HeaderHops = "Delay-Hops"

	// HeaderError is set on dead letters: a one-line reason.
	HeaderError = "Delay-Error"

	// HeaderSubject is set on dead letters: the subject the message was
	// published (or was to be delivered) to.
	HeaderSubject = "Delay-Subject"

	// HeaderMsgID is set on dead letters that carried a publisher
	// Nats-Msg-Id: the dead-letter stream dedupes on its own id, so the
	// publisher's id is kept here.
	HeaderMsgID = "Delay-Msg-Id"

	// HeaderMergeKey coalesces: while a message with this key and target is
	// pending, later ones with the same key and target are merged into it
	// (their payloads dropped and counted). "Delay-Merge-Key: user-42".
	HeaderMergeKey = "Delay-Merge-Key"

	// HeaderPartitionKey chooses the partition of a partitioned level
	// (DELAYD_PARTITIONS): messages with one key go to one partition stream
	// and keep their order. Without it the key is the target subject. It is
	// a control header and never reaches the target: "Delay-Partition-Key: user-42".
	HeaderPartitionKey = "Delay-Partition-Key"

	// HeaderAttempt is set by retry ladders: the attempt this delivery is,
	// 1 for the first retry.
	HeaderAttempt = "Delay-Attempt"

	// HeaderNatsMsgID is JetStream's de-duplication header. delayd keeps the
	// publisher's value on delivery, or derives one from the ingress sequence.
	HeaderNatsMsgID = "Nats-Msg-Id"

	// HeaderStatus is set on the cancel API's replies: the answer's code,
	// decimal, with HTTP's meanings ("200", "404", ...; the CancelStatus*
	// constants, e.g. [CancelStatusNotFound]). The body keeps the answer's
	// text, so the nats CLI and scripts read it as before.
	HeaderStatus = "Delay-Status"
)

// InternalHeaderPrefix starts the headers reserved for delayd ("Delayd-"):
// they are carried on level-stream messages only, and a publisher's headers
// with it are removed at ingress.
const InternalHeaderPrefix = "Delayd-"

// TimeLayout is the layout of HeaderEnqueuedAt and HeaderDueAt: RFC 3339 with
// a fixed nine-digit fraction, always UTC ("2026-11-29T21:59:59.123456789Z").
// Any RFC 3339 parser reads it; the fixed width also sorts as text.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// FormatTime formats t in [TimeLayout], in UTC.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// IsInternalHeader reports whether key is a JetStream header (Nats-*) or
// one reserved for delayd (Delayd-*), in any case: none of them is the
// publisher's to carry across a re-publish.
func IsInternalHeader(key string) bool {
	return hasPrefixFold(key, "Nats-") || hasPrefixFold(key, InternalHeaderPrefix)
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// IsDelayHeader reports whether key is one of the three delay headers,
// Delay-Level, Delay-Duration or Delay-Deliver-At, in any case.
func IsDelayHeader(key string) bool {
	return strings.EqualFold(key, HeaderLevel) ||
		strings.EqualFold(key, HeaderDuration) ||
		strings.EqualFold(key, HeaderDeliverAt)
}

// IsControlHeader reports whether key (in any case) is one of delayd's
// control headers, which are consumed at ingress and never delivered: the
// delay headers, the merge key, the partition key, and the headers delayd sets itself
// (Delay-Enqueued-At, Delay-Due-At, Delay-Hops, Delay-Rescheduled: a
// publisher's own values are replaced or dropped).
func IsControlHeader(key string) bool {
	return IsDelayHeader(key) ||
		strings.EqualFold(key, HeaderMergeKey) ||
		strings.EqualFold(key, HeaderPartitionKey) ||
		strings.EqualFold(key, HeaderHops) ||
		strings.EqualFold(key, HeaderRescheduled) ||
		strings.EqualFold(key, HeaderEnqueuedAt) ||
		strings.EqualFold(key, HeaderDueAt)
}
