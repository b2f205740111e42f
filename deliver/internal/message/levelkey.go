package message

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/index"
)

// LevelKey is the index key of a level message: its publisher's id
// ([index.UserKey]), else its first ingress sequence ([index.SeqKey]:
// Delayd-Origin of a cascading message, else Delayd-Ingress). "" if it has
// neither. It reads the level message's own headers, which the classifier
// writes, so it lives with them.
func LevelKey(h nats.Header) string {
	if id := h.Get(HdrMsgID); id != "" {
		return index.UserKey(id)
	}
	ref := h.Get(HdrOrigin)
	if ref == "" {
		ref = h.Get(HdrIngress)
	}
	if _, seq, ok := ParseIngressRef(ref); ok {
		return index.SeqKey(seq)
	}
	return ""
}

// ParseIngressRef is the inverse of the router's ingressRef: it reads a
// derived id "delayd-<ingress created, unix ns>-<ingress seq>" (Delayd-Ingress).
func ParseIngressRef(ref string) (id string, seq uint64, ok bool) {
	rest, ok := strings.CutPrefix(ref, "delayd-")
	if !ok {
		return "", 0, false
	}
	id, s, ok := strings.Cut(rest, "-")
	if !ok {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	return id, seq, err == nil
}
