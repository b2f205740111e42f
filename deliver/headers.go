package deliver

import (
	"strings"

	"github.com/delayd/delayd/contract"
)

// Internal headers carried on level-stream messages only. The prefix
// "Delayd-" is reserved: publishers' headers with it are removed at ingress.
const (
	hdrInternalPrefix = contract.InternalHeaderPrefix
	hdrMsgID          = "Delayd-Msg-Id"        // the publisher's Nats-Msg-Id, when it gave one
	hdrIngress        = "Delayd-Ingress"       // derived id "delayd-<ingress created, unix ns>-<ingress seq>"
	hdrOrigin         = "Delayd-Origin"        // a cascading message's first derived id: its delivery id
	hdrHops           = "Delayd-Hops"          // hops so far, decimal
	hdrHopDue         = "Delayd-Hop-Due"       // when this level's wait ends, if before Delay-Due-At
	hdrMerge          = "Delayd-Merge"         // the message's merge key, so a hop keeps it
	hdrPartKey        = "Delayd-Partition-Key" // the message's Delay-Partition-Key, so a hop keeps it

	// On a router's epoch marker only (marker.go).
	hdrRouterEpoch = "Delayd-Router-Epoch" // the router lease's epoch of the term that wrote it, decimal
	hdrRouterTail  = "Delayd-Router-Tail"  // the Delayd-Ingress of the level's last router write before it; absent if none
	hdrRouterLease = "Delayd-Router-Lease" // the lease the epoch is of, "router.<i>"; absent: "router"
)

// Headers JetStream adds to direct-get replies that the scanner reads.
const (
	hdrJSSubject   = "Nats-Subject"
	hdrJSSequence  = "Nats-Sequence"
	hdrJSTimeStamp = "Nats-Time-Stamp"
)

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
