package deliver

import (
	"context"
	"crypto/rand"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/offsets"
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

// ScannerConfig configures a [Scanner].
type ScannerConfig struct {
	// Stream is the level stream's name, e.g. "DELAYD_5S". Required.
	Stream string

	// Offsets persists the stream's offset. Required.
	Offsets *offsets.Store

	// Targets tells stream-bound targets from core subjects. Required.
	Targets *TargetIndex

	// Logger is optional. Default discards.
	Logger *slog.Logger

	// Clock is the scanner's local clock. Optional. Default [SystemClock].
	// Due times are server times (store time + delay); the scanner decides
	// due-ness by its estimate of the server's clock (server timestamps plus
	// monotonic time elapsed since), never by Clock.Now. Tests inject a
	// clock whose wall reading is skewed or steps.
	Clock Clock

	// StartedAt and StartGrace: deliveries to core subjects that were
	// already due at StartedAt (overdue after downtime) are held until
	// StartGrace has passed since StartedAt, so that core subscribers
	// disconnected by an embedded-server restart can reconnect first.
	// [Scanner.Reconnected] moves StartedAt to a reconnect. Messages that
	// fall due later, and stream-bound targets, are not held. StartedAt is
	// a local time.Now() reading: only the monotonic time elapsed since it
	// counts. Optional; a zero StartedAt holds nothing until a reconnect.
	StartedAt  time.Time
	StartGrace time.Duration

	// Prefix is delayd's ingress prefix, where a cascading message moves on
	// to its next level. Optional. Default [contract.PrefixDefault].
	Prefix string

	// OnDelivery is called for every delivery as it is published, with its
	// lateness (publish time - due, by the server's clock). It runs on the
	// scanner's goroutine: keep it cheap (a histogram observation). Optional.
	OnDelivery func(lateness time.Duration)

	// Batch, BatchBytes, Window, PurgeEvery and MaxAttempts are optional;
	// defaults are the Scanner*Default constants.
	Batch       int
	BatchBytes  int
	Window      int
	PurgeEvery  time.Duration
	MaxAttempts int
}

// level returns c as the level owner's config, field for field.
func (c ScannerConfig) level() level.Config {
	var targets *target.Bindings
	if c.Targets != nil {
		targets = c.Targets.b
	}
	var clock level.Clock
	if c.Clock != nil {
		clock = c.Clock
	}
	return level.Config{
		Stream: c.Stream, Offsets: c.Offsets, Targets: targets, Logger: c.Logger, Clock: clock,
		StartedAt: c.StartedAt, StartGrace: c.StartGrace, Prefix: c.Prefix, OnDelivery: c.OnDelivery,
		Batch: c.Batch, BatchBytes: c.BatchBytes, Window: c.Window, PurgeEvery: c.PurgeEvery, MaxAttempts: c.MaxAttempts,
	}
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

// Scanner delivers one level stream. It reads the stream in sequence order
// from its committed offset, waits exactly until the head's due time (no
// polling interval: one timer for the head), publishes every due message to
// its target, and commits the offset once the hand-offs are confirmed: a
// PubAck for a stream-bound target, a flush round trip for a core subject.
// It then purges the delivered prefix, always keeping the stream's last
// delivered message (the router reads the tail to stay exactly-once).
//
// A scanner holds at most one and a half pull batches in memory (Batch
// messages each, at most BatchBytes or twice the server's max payload),
// whatever the backlog. It reads through an unacknowledged consumer it
// creates at its own offset (see feed); the offset, not the consumer, is the
// position, so a consumer the server drops while a 2 h level waits for its
// head is simply recreated.
//
// Semantics follow RocketMQ 4's ScheduleMessageService DeliverDelayedMessageTimerTask,
// except that delayd waits for the head's due time instead of rechecking
// every 100 ms, and commits after every confirmed window instead of every 10 s.
type Scanner struct {
	l *level.Level // the level owner (deliver/internal/level), of which Scanner is the exported shape
}

// NewScanner returns a scanner for one level stream on its own, outside a
// [Service], for example to measure delivery alone. js serves its stream
// reads and synchronous publishes (tombstones, index records): its
// deliveries and hop forwards go through its own PubAck tracker on nc.
// Such a scanner signs the cascading messages it moves on with a
// hop key of its own, random, so a router trusts none of their hop headers;
// it tells no router that a merge key is free; and it counts dead letters
// only in [Scanner.Stats]. A [Service] builds its scanners with its hop
// key, dead-letter accounting and router.
func NewScanner(nc *nats.Conn, js jetstream.JetStream, cfg ScannerConfig) (*Scanner, error) {
	key := make(hop.Key, hop.KeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return newScanner(nc, js, cfg, level.Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key})
}

// newScanner returns a scanner wired to the rest of delayd.
func newScanner(nc *nats.Conn, js jetstream.JetStream, cfg ScannerConfig, wiring level.Wiring) (*Scanner, error) {
	l, err := level.New(nc, js, cfg.level(), wiring)
	if err != nil {
		return nil, err
	}
	return &Scanner{l: l}, nil
}

// Written tells the scanner its stream now holds sequence seq, for the
// pending count in [Scanner.Stats]. The router reports each confirmed write.
func (s *Scanner) Written(seq uint64) { s.l.Written(seq) }

// Reconnected tells the scanner its connection came back after an outage:
// core subscribers are reconnecting too, so deliveries to core subjects
// that fell due while the server was away wait the start grace from now.
// Safe from any goroutine.
func (s *Scanner) Reconnected() { s.l.Reconnected() }

// Stalled reports whether a due head has waited longer than
// [ScannerStallAfterDefault] without being handed off (the offset moving
// past it), however many attempts were made: the target keeps refusing it,
// DELAYD_DLQ refuses its dead letter, or the server is unreachable.
func (s *Scanner) Stalled() bool { return s.l.Stalled() }

// Stats returns the scanner's counters.
func (s *Scanner) Stats() ScannerStats { return ScannerStats(s.l.Stats()) }

// Run delivers until ctx is done. On the way out it confirms what is in
// flight, commits the offset and returns nil. It survives server restarts,
// retrying with capped, jittered backoff.
func (s *Scanner) Run(ctx context.Context) error { return s.l.Run(ctx) }

// runTerm runs the scanner as the level's owner for one term of its lease
// ([level.Level.RunTerm]).
func (s *Scanner) runTerm(ctx context.Context, t ownership.Term) error { return s.l.RunTerm(ctx, t) }
