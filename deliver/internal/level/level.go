package level

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// Level defaults.
const (
	// BatchDefault is how many messages one read of the level stream returns at most.
	BatchDefault = 512
	// BatchBytesDefault bounds one read's payload bytes, and so the
	// scanner's memory, whatever the backlog.
	BatchBytesDefault = 1 << 20
	// WindowDefault is how many deliveries may await confirmation
	// before the scanner confirms them and commits its offset.
	WindowDefault = 512
	// PurgeEveryDefault is the least time between purges of the
	// delivered prefix while the level is busy.
	PurgeEveryDefault = time.Second
	// MaxAttemptsDefault is how often a delivery refused permanently by
	// its target (for example too large for the target stream) is tried before
	// it is dead-lettered. Transient failures are retried for ever.
	MaxAttemptsDefault = 3

	// StallAfterDefault is how long a due head may go without being
	// handed off (the offset moving past it) before the scanner reports
	// itself stalled, however often it was tried meanwhile.
	StallAfterDefault = 30 * time.Second

	// loadTimeout bounds one try of a scanner's load (stream info,
	// offset load and bump): tried again after it, with backoff.
	loadTimeout = 4 * time.Second
)

// Config configures a [Level].
type Config struct {
	// Stream is the level stream's name, e.g. "DELAYD_5S". Required.
	Stream string

	// Offsets persists the stream's offset. Required.
	Offsets *offsets.Store

	// Targets tells stream-bound targets from core subjects. Required.
	Targets *target.Bindings

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
	// [Level.Reconnected] moves StartedAt to a reconnect. Messages that
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
	// defaults are the Level*Default constants.
	Batch       int
	BatchBytes  int
	Window      int
	PurgeEvery  time.Duration
	MaxAttempts int
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = SystemClock
	}
	if c.Prefix == "" {
		c.Prefix = contract.PrefixDefault
	}
	if c.Batch == 0 {
		c.Batch = BatchDefault
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = BatchBytesDefault
	}
	if c.Window == 0 {
		c.Window = WindowDefault
	}
	if c.PurgeEvery == 0 {
		c.PurgeEvery = PurgeEveryDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
}

func (c *Config) validate() error {
	switch {
	case c.Stream == "":
		return errors.New("deliver: scanner: Stream is required")
	case c.Offsets == nil:
		return errors.New("deliver: scanner: Offsets is required")
	case c.Targets == nil:
		return errors.New("deliver: scanner: Targets is required")
	case c.Batch < 1 || c.BatchBytes < 1 || c.Window < 1 || c.MaxAttempts < 1 || c.PurgeEvery < 0:
		return errors.New("deliver: scanner: Batch, BatchBytes, Window and MaxAttempts must be positive")
	}
	return nil
}

// Wiring is what a scanner shares with the rest of delayd. A
// deliver.Service fills it from its own state; [NewForTest] fills it for a
// scanner on its own.
type Wiring struct {
	// Reasons counts dead letters by reason, shared with the router.
	// Required.
	Reasons *message.ReasonCounts

	// Refused tracks the dead letters DELAYD_DLQ refused, shared with the
	// router. Required.
	Refused *message.Refusals

	// HopKey signs cascading messages moving on to their next level, so
	// that the router trusts their first id, enqueue time and hop count,
	// and derives delivery ids. Required.
	HopKey hop.Key

	// MergeGone tells the router a merge key's message was cancelled or
	// left delayd, so the key is free. It runs on the scanner's goroutine.
	// Optional: nil tells no one (a scanner without a router).
	MergeGone func(index.Record)

	// Fenced runs the scanner as its level's owner under a lease: every
	// offset write is a compare-and-set (offsets.CommitterConfig.Fenced),
	// each load bumps the offset key (offsets.Store.Bump) before it loads
	// the tombstones, and the scanner stops at a failed compare-and-set.
	// Optional: false for a scanner on its own (plain offset writes).
	Fenced bool

	// Gate holds the level's messages routed under its current partition
	// count while another stream of the level still holds one routed
	// under an older count (docs/operations.md#partitions-for-hot-levels). Optional:
	// nil holds nothing.
	Gate *OrderGate

	// Routed waits until the router has placed every ingress message
	// published before the call (caughtUp false: not yet, ask again), so
	// the mover reads a move's new message's index record if it is stored
	// (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover).
	// Optional, but without it the mover settles nothing: a loaded move's
	// head is held until a term with it loads it.
	Routed func(ctx context.Context) (caughtUp bool, err error)
}

func (w *Wiring) validate() error {
	switch {
	case w.Reasons == nil:
		return errors.New("deliver: scanner: dead-letter reason counts are required")
	case w.Refused == nil:
		return errors.New("deliver: scanner: dead-letter refusals are required")
	case len(w.HopKey) == 0:
		return errors.New("deliver: scanner: a hop key is required")
	}
	return nil
}

// settings are a scanner's config and its wiring, as validated, and what
// New derives from them. Immutable after New.
type settings struct {
	Config
	Wiring
	subject string        // "delayd.level.<NAME>."
	delay   time.Duration // the level's delay, parsed from Stream
}

// Stats are a scanner's counters and position.
type Stats struct {
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

// Level delivers one level stream. It reads the stream in sequence order
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
//
// A Level is one level stream in this process, for the process's life:
// the Service builds one per level stream, and [Level.RunTerm] runs a
// fresh owner (owner.go) for each term of the stream's lease. Level keeps
// what outlives a term (docs/reshape.md 2.1); its fields are grouped by
// what they are and who writes them (groups.go).
type Level struct {
	cfg    settings     // immutable after New: config, wiring, subject and delay
	deps   deps         // immutable after New: nc, js
	logger *slog.Logger // immutable after New
	// commits writes the offset, one write in flight behind the
	// deliveries it confirms; the current owner's loop commits.
	commits *offsets.Committer
	grace   *startGrace // the start and reconnect grace of core deliveries
	clock   levelClock  // the server-clock estimate: the current owner's loop (Stats reads srv)
	stats   counters    // atomics: the current owner's loop (and Written, RunTerm) writes, any reads
	cancel  cancelState // the book (its own lock) and the retirer's queue
	slot    termSlot    // the current term's owner, for other goroutines: RunTerm writes, any reads
	hooks   testHooks   // set by tests before Run
	// replaced: the stored offset belongs to a deleted stream. Written by
	// an owner's loop; read by the next load (the next owner's, perhaps).
	replaced bool
}

// NewForTest returns a scanner for one level stream on its own, outside a
// deliver.Service (unfenced; the zero Term with [Level.Run]), for tests.
// js serves its stream reads and synchronous publishes (tombstones, index
// records): its deliveries and hop forwards go through its own PubAck
// tracker on nc. Such a scanner signs the cascading messages it
// moves on with a hop key of its own, random, so a router trusts none of
// their hop headers; it tells no router that a merge key is free; and it
// counts dead letters only in [Level.Stats]. A deliver.Service builds its
// scanners with its hop key, dead-letter accounting and router.
func NewForTest(nc *nats.Conn, js jetstream.JetStream, cfg Config) (*Level, error) {
	key := make(hop.Key, hop.KeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return New(nc, js, cfg, Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key})
}

// New returns a scanner wired to the rest of delayd.
func New(nc *nats.Conn, js jetstream.JetStream, cfg Config, wiring Wiring) (*Level, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := wiring.validate(); err != nil {
		return nil, err
	}
	delay, ok := levels.ParseStreamName(cfg.Stream)
	if !ok {
		return nil, fmt.Errorf("deliver: scanner: %q is not a level stream name", cfg.Stream)
	}
	name := strings.TrimPrefix(cfg.Stream, levels.StreamPrefix)
	logger := cfg.Logger.With(slog.String("stream", cfg.Stream))
	commits, err := offsets.NewCommitter(cfg.Offsets, offsets.CommitterConfig{Stream: cfg.Stream, Timeout: jswire.OpTimeout, Fenced: wiring.Fenced, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("deliver: scanner: %w", err)
	}
	sc := &Level{
		cfg:     settings{Config: cfg, Wiring: wiring, subject: contract.LevelSubjectPrefix + name + ".", delay: delay},
		deps:    deps{nc: nc, js: js},
		logger:  logger,
		commits: commits,
		grace:   newStartGrace(cfg.Clock, cfg.StartGrace, cfg.StartedAt),
		clock:   levelClock{srv: &serverClock{clock: cfg.Clock}},
		cancel: cancelState{
			book:   newCancelBook(),
			retire: make(chan retiree, 1024),
		},
		hooks: testHooks{ackTimeout: jswire.WriteAttempt},
	}
	return sc, nil
}

// Written tells the scanner its stream now holds sequence seq, for the
// pending count in [Level.Stats]. The router reports each confirmed write.
func (s *Level) Written(seq uint64) {
	for {
		cur := s.stats.lastSeq.Load()
		if seq <= cur || s.stats.lastSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

func (s *Level) oldestDueAge() time.Duration {
	due := s.stats.headDue.Load()
	if due == 0 {
		return 0
	}
	return max(s.clock.srv.now().Sub(time.Unix(0, due)), 0)
}

func sat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// Reconnected tells the scanner its connection came back after an outage:
// core subscribers are reconnecting too, so deliveries to core subjects
// that fell due while the server was away wait the start grace from now.
// Safe from any goroutine.
func (s *Level) Reconnected() { s.grace.reconnected() }

// progress restarts the stall clock. It is called only for progress: the
// offset moved past a head, the level holds no due head, or a new head fell
// due. A failed attempt, a retry or a wake-up is not progress. The clock is
// the monotonic one ([Clock].Mono): a step of the wall clock does not move it.
func (s *Level) progress() { s.stats.lastProgress.Store(int64(s.cfg.Clock.Mono())) }

// headFellDue records that a head due at due (server time) is now waiting to
// be handed off; the stall clock starts unless a due head already waits.
func (s *Level) headFellDue(due time.Time) {
	if s.stats.headDue.Load() == 0 {
		s.stats.headDue.Store(due.UnixNano())
		s.progress()
	}
}

// noDueHead records that the level holds no due head: nothing can stall.
func (s *Level) noDueHead() {
	s.stats.headDue.Store(0)
	s.progress()
}

// Stalled reports whether a due head has waited longer than
// [StallAfterDefault] without being handed off (the offset moving
// past it), however many attempts were made: the target keeps refusing it,
// DELAYD_DLQ refuses its dead letter, or the server is unreachable.
func (s *Level) Stalled() bool {
	if s.stats.headDue.Load() == 0 {
		return false
	}
	return s.cfg.Clock.Mono()-time.Duration(s.stats.lastProgress.Load()) > StallAfterDefault
}

// Stats returns the scanner's counters.
func (s *Level) Stats() Stats {
	return Stats{
		Stream: s.cfg.Stream, Offset: s.commits.Committed(), Delivered: s.stats.delivered.Load(),
		DeadLettered: s.stats.deadLettered.Load(), Retries: s.stats.retries.Load(), Forwarded: s.stats.forwarded.Load(),
		Cancelled:    s.stats.cancelledN.Load(),
		Pending:      sat(s.stats.lastSeq.Load(), s.commits.Committed()),
		CommitLag:    sat(s.commits.Committed(), s.commits.Stored()),
		OldestDueAge: s.oldestDueAge(),
		LastLateness: time.Duration(s.stats.lastLateness.Load()),
		ClockBound:   s.clock.srv.lead(),
		Steps:        s.stats.steps.Load(),
		Owner:        s.slot.get() != nil,
		Epoch:        s.stats.epoch.Load(),
		FencedWrites: s.stats.fencedWrites.Load(),
	}
}

// errLeaderless is a scanner load's error while the level stream has no
// leader: its load is retried.
var errLeaderless = errors.New("level stream has no leader (a follower answered its info; its state may lag): retrying")

// RunTerm runs the scanner for one term of its level's lease: until ctx is
// done (a stop, or the term's end) or the scanner finds its term no longer
// valid. It confirms what is in flight and commits on the way out, like
// [Level.Run]; the elector releases the lease after it returns. For the
// term it serves the level's decide subject ([contract.DecideSubject]),
// and stops serving it before it returns, so before the release.
//
// It builds a fresh owner for the term, publishes it in the term slot for
// other goroutines while the term runs, and drops it when the term ends.
func (s *Level) RunTerm(ctx context.Context, t ownership.Term) error {
	o := newOwner(s, t)
	o.term.Recovering(true) // until it has started: not handed over meanwhile
	s.stats.epoch.Store(t.Epoch)
	s.slot.begin(o)           // "owned here" from now: askers reach o (and wait for its load)
	srv := newDecideServer(o) // the NATS door for other replicas, for this term only
	srv.Start(ctx)
	defer func() {
		srv.Stop()               // unsubscribe, answer queued requests "not owner", wait for its workers
		s.slot.end(o)            // "not owned here": askers go to the next owner
		s.stats.headDue.Store(0) // not this replica's head any more: never "stalled"
	}()
	return o.run(ctx)
}
