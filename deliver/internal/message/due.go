package message

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// LevelDue returns when a scanner acts on a level-stream message with
// headers h: the end of its wait at this level if it cascades on
// (Delayd-Hop-Due), else its Delay-Due-At. ok is false if neither parses.
func LevelDue(h nats.Header) (due time.Time, ok bool) {
	if t, err := time.Parse(time.RFC3339Nano, h.Get(HdrHopDue)); err == nil {
		return t, true
	}
	t, err := time.Parse(time.RFC3339Nano, h.Get(contract.HeaderDueAt))
	return t, err == nil
}

// StripInternal removes every header a level-stream message carries for
// JetStream or delayd only: the direct-get headers, the router's
// Nats-Expected-Last-Sequence and the reserved Delayd-* headers. The router
// already removed publishers' Nats-* instructions, so no Nats-* header may
// reach a target except the Nats-Msg-Id the caller sets.
func StripInternal(h nats.Header) {
	for k := range h {
		if contract.IsInternalHeader(k) {
			delete(h, k)
		}
	}
}
