package jswire

import (
	"strconv"
	"strings"
	"time"
)

// Ack bodies of the JetStream consumer protocol, sent as the reply to a
// data message's $JS.ACK subject.
var (
	// AckAck acknowledges a message: it is done.
	AckAck = []byte("+ACK")
	// AckProgress resets the message's ack wait: still working on it.
	AckProgress = []byte("+WPI")
	// AckTerm ends the message's deliveries without processing it.
	AckTerm = []byte("+TERM")
)

// AckPrefix begins every JetStream data message's reply subject.
const AckPrefix = "$JS.ACK."

// AckMeta holds the fields of a $JS.ACK reply subject delayd uses.
type AckMeta struct {
	// StreamSeq is the message's sequence in its stream.
	StreamSeq uint64
	// Stored is when the server stored the message (the server's clock,
	// nanosecond precision).
	Stored time.Time
	// Delivered counts the consumer's deliveries of the message, this one
	// included: 1 on the first.
	Delivered uint64
	// ConsumerSeq is the consumer's delivery sequence: 1 for its first
	// delivery, one more for each delivery after it (a redelivery too), so
	// a reader that sees it jump has lost a delivery in transit. 0 when
	// the token is not a decimal number.
	ConsumerSeq uint64
}

// ParseAck reads the metadata of a JetStream data message from its reply
// subject, in either of the server's two formats:
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>                          (9 tokens)
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>...] (11 or more tokens)
//
// ts is the store time in Unix nanoseconds. Like nats.go
// (internal/parser.GetMetadataFields), a v2 subject is valid with 11
// tokens or more: tokens after the 11th (today one random token) are not
// read, so a server that adds one does not make every message unreadable.
// ok is false for 10 tokens or fewer than 9, a subject not starting with
// [AckPrefix], or a delivered, sseq or ts token that is not a decimal
// number. A cseq token that is not a decimal number leaves ConsumerSeq 0;
// the pending token is not read.
func ParseAck(reply string) (meta AckMeta, ok bool) {
	rest, ok := strings.CutPrefix(reply, AckPrefix)
	if !ok {
		return AckMeta{}, false
	}
	n := strings.Count(rest, ".") + 1 // tokens after the prefix
	var skip int                      // tokens before <stream>
	switch {
	case n == 7: // v1: stream consumer delivered sseq dseq ts pending
	case n >= 9: // v2: domain acchash stream consumer delivered sseq dseq ts pending [token...]
		skip = 2
	default:
		return AckMeta{}, false
	}
	var f [5]string // delivered sseq dseq ts pending
	for range skip + 1 {
		_, rest, _ = strings.Cut(rest, ".") // past domain, acchash, stream
	}
	_, rest, _ = strings.Cut(rest, ".") // past consumer
	for i := range f {
		f[i], rest, _ = strings.Cut(rest, ".")
	}
	delivered, err1 := strconv.ParseUint(f[0], 10, 64)
	sseq, err2 := strconv.ParseUint(f[1], 10, 64)
	ts, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return AckMeta{}, false
	}
	cseq, _ := strconv.ParseUint(f[2], 10, 64)
	return AckMeta{StreamSeq: sseq, Stored: time.Unix(0, ts), Delivered: delivered, ConsumerSeq: cseq}, true
}
