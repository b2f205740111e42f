package deliver

import (
	"time"

	"github.com/delayd/delayd/deliver/internal/level"
)

// Scanner defaults.
const (
	// ScannerBatchDefault is how many messages one read of the level stream returns at most.
	ScannerBatchDefault = 512
	// ScannerBatchBytesDefault bounds one read's payload bytes, and so the
	// scanner's memory, whatever the backlog.
	ScannerBatchBytesDefault = 1 << 20
	// ScannerWindowDefault is how many deliveries may await confirmation
	// before the scanner confirms them and commits its offset.
	ScannerWindowDefault = 512
	// ScannerPurgeEveryDefault is the least time between purges of the
	// delivered prefix while the level is busy.
	ScannerPurgeEveryDefault = time.Second
	// ScannerMaxAttemptsDefault is how often a delivery refused permanently by
	// its target (for example too large for the target stream) is tried before
	// it is dead-lettered. Transient failures are retried for ever.
	ScannerMaxAttemptsDefault = 3

	// ScannerStallAfterDefault is how long a due head may go without being
	// handed off (the offset moving past it) before the scanner reports
	// itself stalled, however often it was tried meanwhile.
	ScannerStallAfterDefault = 30 * time.Second
)

// The defaults are the level owner's (level.BatchDefault…), written out
// here for go doc; this fails to compile if the two differ.
const _ = uint(ScannerBatchDefault-level.BatchDefault) + uint(level.BatchDefault-ScannerBatchDefault) +
	uint(ScannerBatchBytesDefault-level.BatchBytesDefault) + uint(level.BatchBytesDefault-ScannerBatchBytesDefault) +
	uint(ScannerWindowDefault-level.WindowDefault) + uint(level.WindowDefault-ScannerWindowDefault) +
	uint(ScannerPurgeEveryDefault-level.PurgeEveryDefault) + uint(level.PurgeEveryDefault-ScannerPurgeEveryDefault) +
	uint(ScannerMaxAttemptsDefault-level.MaxAttemptsDefault) + uint(level.MaxAttemptsDefault-ScannerMaxAttemptsDefault) +
	uint(ScannerStallAfterDefault-level.StallAfterDefault) + uint(level.StallAfterDefault-ScannerStallAfterDefault)

// ScannerConfig tunes the delivery of every level stream of a [Service]
// ([Config].Scanner): how much its owner reads at once, how many
// deliveries await confirmation, how often it purges and how often a
// delivery refused permanently is tried. Every field is optional; the
// defaults are the Scanner*Default constants. (Scanner is the level
// owner's older name: docs/glossary.md.)
type ScannerConfig struct {
	Batch       int
	BatchBytes  int
	Window      int
	PurgeEvery  time.Duration
	MaxAttempts int
}

// ScannerStats are a scanner's counters and position.
type ScannerStats struct {
	Stream       string
	Offset       uint64        // last committed sequence
	Delivered    uint64        // confirmed deliveries since start
	DeadLettered uint64        // deliveries refused permanently, sent to DELAYD_DLQ
	Retries      uint64        // failed deliveries retried
	Forwarded    uint64        // cascading messages moved on to their next level
	Cancelled    uint64        // messages cancelled through the cancel API since start
	Pending      uint64        // messages written to the level stream past the committed offset
	CommitLag    uint64        // confirmed deliveries whose offset write is not acknowledged yet
	OldestDueAge time.Duration // how long the due head has waited undelivered, by the server's clock; 0 if none is due
	LastLateness time.Duration // lateness of the last delivery: delivered - due, by the server's clock
	ClockBound   time.Duration // upper bound on the local wall clock's lead over the server's clock
	Steps        uint64        // scanner loop iterations since start (reads, deliveries, waits): a busy loop shows here
	Owner        bool          // this replica holds the level's lease and runs its scanner now
	Epoch        uint64        // the epoch of this replica's last term of the level's lease; 0 if it never held it
	FencedWrites uint64        // offset commits refused as fenced (another owner wrote the offset); each stopped the level
}
