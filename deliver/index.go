package deliver

import (
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
)

// The id index (deliver/internal/index): where each pending message is, by
// id and by merge key, for cancel and merge, and the cancel tombstones. The
// router writes a record per placement before it acks the ingress message;
// cancel and merge look records up; the service purges records older than
// the oldest head any level had [IndexKeep] ago, so a message's records
// outlive its leaving its level by at least IndexKeep.
const (
	// IndexStream holds the id index: "DELAYD_INDEX".
	IndexStream = index.Stream
	// IndexSlots is how many subjects the index spreads its records over:
	// 256, "delayd.idx.0" to "delayd.idx.255".
	IndexSlots = index.Slots
	// IndexKeep is how long, at least, records of messages that left their
	// level stay (Config.IndexKeep): a cancel that late still answers
	// "already delivered" or "cancelled".
	IndexKeep = time.Minute

	// CancelStream holds cancel tombstones: "DELAYD_CANCELS", one message
	// per cancelled, still pending level message, on
	// "delayd.cancels.<level stream>", deleted once the level's offset has
	// passed it.
	CancelStream = index.CancelStream
)
