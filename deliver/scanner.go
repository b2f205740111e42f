package deliver

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/leadership"
	"github.com/delayd/delayd/levels"
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

	opTimeout = 10 * time.Second
)

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

func (c *ScannerConfig) setDefaults() {
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
		c.Batch = ScannerBatchDefault
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = ScannerBatchBytesDefault
	}
	if c.Window == 0 {
		c.Window = ScannerWindowDefault
	}
	if c.PurgeEvery == 0 {
		c.PurgeEvery = ScannerPurgeEveryDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = ScannerMaxAttemptsDefault
	}
}

func (c *ScannerConfig) validate() error {
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

// scannerWiring is what a scanner shares with the rest of delayd. A
// [Service] fills it from its own state; [NewScanner] fills it for a
// scanner on its own.
type scannerWiring struct {
	// reasons counts dead letters by reason, shared with the router.
	// Required.
	reasons *reasonCounts

	// refused tracks the dead letters DELAYD_DLQ refused, shared with the
	// router. Required.
	refused *dlqRefusals

	// hopKey signs cascading messages moving on to their next level, so
	// that the router trusts their first id, enqueue time and hop count,
	// and derives delivery ids. Required.
	hopKey hopKey

	// mergeGone tells the router a merge key's message was cancelled or
	// left delayd, so the key is free. It runs on the scanner's goroutine.
	// Optional: nil tells no one (a scanner without a router).
	mergeGone func(index.Record)

	// fenced runs the scanner as its level's owner under a lease: every
	// offset write is a compare-and-set (offsets.CommitterConfig.Fenced),
	// each start bumps the offset key (offsets.Store.Bump) before it loads
	// the tombstones, and the scanner stops at a failed compare-and-set.
	// Optional: false for a scanner on its own (plain offset writes).
	fenced bool

	// gate holds the level's messages routed under its current partition
	// count while another stream of the level still holds one routed
	// under an older count (README "Partitions for hot levels"). Optional:
	// nil holds nothing.
	gate *orderGate
}

func (w *scannerWiring) validate() error {
	switch {
	case w.reasons == nil:
		return errors.New("deliver: scanner: dead-letter reason counts are required")
	case w.refused == nil:
		return errors.New("deliver: scanner: dead-letter refusals are required")
	case len(w.hopKey) == 0:
		return errors.New("deliver: scanner: a hop key is required")
	}
	return nil
}

// scannerSettings are a scanner's config and its wiring, as validated.
type scannerSettings struct {
	ScannerConfig
	scannerWiring
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
	nc      *nats.Conn
	js      jetstream.JetStream
	cfg     scannerSettings
	logger  *slog.Logger
	reader  *jswire.BatchReader
	stream  jetstream.Stream
	subject string // "delayd.level.<NAME>."

	// acks publishes the deliveries to stream-bound targets and the hop
	// forwards and tracks their PubAcks (one reply subscription for the
	// scanner, a write failing after ackTimeout without one, or at once
	// when the connection starts reconnecting); open while Run runs.
	acks       *jswire.PubAcks
	ackTimeout time.Duration
	loseAcks   func(n uint64) bool // tests: the n-th write's PubAck is dropped (jswire.PubAcks.LoseReplies)

	offset    uint64 // last confirmed sequence
	purgedTo  uint64
	lastPurge time.Duration // monotonic reading of the last purge
	next      uint64        // next sequence to read
	grace     *coreGrace    // the start and reconnect grace of core deliveries
	// coreUnflushed is set by the first core publish since the last flush,
	// with coreReconnects, the connection's reconnect count then: a
	// different count at the next flush means a reconnect in between,
	// which that flush cannot vouch for.
	coreUnflushed  bool
	coreReconnects uint64
	restart        bool      // start over: the stream is not the one the offset belongs to
	replaced       bool      // the stored offset belongs to a deleted stream
	created        time.Time // the level stream's creation time
	feed           *feed
	resetFeed      bool      // the feed must restart at next
	feedFresh      bool      // no message read since the feed restarted
	head           *nats.Msg // the message being waited for or delivered
	headMeta       jswire.AckMeta
	win            *window // the confirmation window: deliveries in flight and their outcomes
	backoff        *backoff
	delay          time.Duration

	// srv estimates the server's clock, a lower bound: a message stored at
	// server time ts and read at monotonic reading m proves the server's
	// clock had passed ts by m. Delivering once the estimate reaches due
	// therefore is never early by the server's clock, and a step of the
	// local wall clock does not move it (README "Guarantees").
	srv *serverClock
	// freshSeq is the level stream's last sequence at the last fresh
	// observation: messages up to it tell the estimate nothing new.
	freshSeq uint64
	// obsSeq and obsStored are the last message observed: a later sequence
	// stored at an earlier time shows the server's clock stepped back.
	obsSeq    uint64
	obsStored time.Time

	// commits writes the offset, one write in flight behind the
	// deliveries it confirms; the scanner's goroutine commits.
	commits    *offsets.Committer
	tombsAcked uint64 // the acknowledged offset tombstones were last dropped to

	steps        atomic.Uint64
	lastSeq      atomic.Uint64 // the level stream's last sequence, as far as known
	headDue      atomic.Int64  // unix ns of a due head not yet delivered; 0 if none
	lastProgress atomic.Int64  // Clock.Mono reading: the last offset move, no due head, or a head falling due

	cancels    chan cancelReq   // cancel requests, decided on the scanner's goroutine (no I/O there)
	wake       chan struct{}    // wakes the scanner from a wait to decide them
	book       *cancelBook      // tombstones and reservations: the one owner of cancel state
	janitor    chan retiree     // tombstones to delete (runJanitor)
	tombstones jetstream.Stream // CancelStream
	startTail  uint64           // the level stream's last sequence at start
	idMAC      *idMAC           // derives delivery ids (scanner goroutine)
	startedAt  time.Time        // when the scanner (re)started, by the server's clock
	cancelledN atomic.Uint64
	passed     atomic.Uint64 // highest sequence handed off (delivered, forwarded, skipped)

	delivered, deadLettered, retries, forwarded atomic.Uint64
	lastLateness                                atomic.Int64

	// term is the lease term the scanner runs in ([Scanner.runTerm]); the
	// zero Term, always held, for a scanner on its own. fencedStop is set
	// when an offset commit failed its compare-and-set: the level stops.
	// Scanner goroutine only.
	term       leadership.Term
	fencedStop bool
	gateHeld   string // what the order gate last held the head for (logged once)
	// owned and epoch mirror term for Stats; fencedWrites counts fenced
	// commits.
	owned        atomic.Bool
	epoch        atomic.Uint64
	fencedWrites atomic.Uint64
	// decides is set once the scanner's start loaded its offset and
	// tombstones (in a term: after its bump): from then on pendingAt
	// answers for this replica's view of the level. Cleared at each
	// (re)start and at the term's end.
	decides atomic.Bool
}

// NewScanner returns a scanner for one level stream on its own, outside a
// [Service], for example to measure delivery alone. js must have been
// created with a publish-async timeout so that every PubAck future
// resolves. Such a scanner signs the cascading messages it moves on with a
// hop key of its own, random, so a router trusts none of their hop headers;
// it tells no router that a merge key is free; and it counts dead letters
// only in [Scanner.Stats]. A [Service] builds its scanners with its hop
// key, dead-letter accounting and router.
func NewScanner(nc *nats.Conn, js jetstream.JetStream, cfg ScannerConfig) (*Scanner, error) {
	key := make(hopKey, hopKeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return newScanner(nc, js, cfg, scannerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: key})
}

// newScanner returns a scanner wired to the rest of delayd.
func newScanner(nc *nats.Conn, js jetstream.JetStream, cfg ScannerConfig, wiring scannerWiring) (*Scanner, error) {
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
	commits, err := offsets.NewCommitter(cfg.Offsets, offsets.CommitterConfig{Stream: cfg.Stream, Timeout: opTimeout, Fenced: wiring.fenced, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("deliver: scanner: %w", err)
	}
	sc := &Scanner{
		nc: nc, js: js, cfg: scannerSettings{cfg, wiring},
		logger:  logger,
		commits: commits,
		subject: levelSubjects + name + ".",
		cancels: make(chan cancelReq, 64),
		wake:    make(chan struct{}, 1),
		book:    newCancelBook(),
		janitor: make(chan retiree, 1024),
		win:     newWindow(cfg.Window),
		backoff: newBackoff(100*time.Millisecond, 5*time.Second),
		delay:   delay,
		srv:     &serverClock{clock: cfg.Clock},
		grace:   newCoreGrace(cfg.Clock, cfg.StartGrace, cfg.StartedAt),

		ackTimeout: publishAsyncTimeout,
	}
	return sc, nil
}

// Written tells the scanner its stream now holds sequence seq, for the
// pending count in [Scanner.Stats]. The router reports each confirmed write.
func (s *Scanner) Written(seq uint64) {
	for {
		cur := s.lastSeq.Load()
		if seq <= cur || s.lastSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

func (s *Scanner) oldestDueAge() time.Duration {
	due := s.headDue.Load()
	if due == 0 {
		return 0
	}
	return max(s.srv.now().Sub(time.Unix(0, due)), 0)
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
func (s *Scanner) Reconnected() { s.grace.reconnected() }

// observeClock tightens the estimate of the server's clock with a level
// message's sequence and store time, read just now. A later sequence stored
// at an earlier time shows the server's clock stepped back: the estimate
// restarts from a fresh stream info at once.
func (s *Scanner) observeClock(ctx context.Context, seq uint64, stored time.Time) {
	if stored.IsZero() {
		return
	}
	if seq > s.obsSeq && stored.Before(s.obsStored) {
		// (In a cluster, also a new stream leader whose clock is behind.)
		s.logger.Info("the server's clock stepped back; re-reading it", slog.Uint64("seq", seq), slog.Duration("step", stored.Sub(s.obsStored)))
		s.obsSeq, s.obsStored = seq, stored
		s.refreshClock(ctx)
		return
	}
	s.obsSeq, s.obsStored = seq, stored
	if seq > s.freshSeq {
		// Stored after the last fresh observation: a lower bound even if
		// the server's clock stepped before it.
		s.srv.observe(stored, false)
	}
}

// refreshClock restarts the estimate of the server's clock from a fresh
// stream info. On failure the estimate stays (it only grows more
// conservative) and the next refresh is tried a refresh interval later.
func (s *Scanner) refreshClock(ctx context.Context) {
	ictx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	info, err := s.stream.Info(ictx)
	if err != nil || info.TimeStamp.IsZero() {
		s.srv.postpone()
		return
	}
	s.freshFrom(info)
}

// freshFrom restarts the estimate from a stream info's server time.
func (s *Scanner) freshFrom(info *jetstream.StreamInfo) {
	if info.TimeStamp.IsZero() {
		return
	}
	s.srv.observe(info.TimeStamp, true)
	s.freshSeq = info.State.LastSeq
}

// progress restarts the stall clock. It is called only for progress: the
// offset moved past a head, the level holds no due head, or a new head fell
// due. A failed attempt, a retry or a wake-up is not progress. The clock is
// the monotonic one ([Clock].Mono): a step of the wall clock does not move it.
func (s *Scanner) progress() { s.lastProgress.Store(int64(s.cfg.Clock.Mono())) }

// headFellDue records that a head due at due (server time) is now waiting to
// be handed off; the stall clock starts unless a due head already waits.
func (s *Scanner) headFellDue(due time.Time) {
	if s.headDue.Load() == 0 {
		s.headDue.Store(due.UnixNano())
		s.progress()
	}
}

// noDueHead records that the level holds no due head: nothing can stall.
func (s *Scanner) noDueHead() {
	s.headDue.Store(0)
	s.progress()
}

// Stalled reports whether a due head has waited longer than
// [ScannerStallAfterDefault] without being handed off (the offset moving
// past it), however many attempts were made: the target keeps refusing it,
// DELAYD_DLQ refuses its dead letter, or the server is unreachable.
func (s *Scanner) Stalled() bool {
	if s.headDue.Load() == 0 {
		return false
	}
	return s.cfg.Clock.Mono()-time.Duration(s.lastProgress.Load()) > ScannerStallAfterDefault
}

// Stats returns the scanner's counters.
func (s *Scanner) Stats() ScannerStats {
	return ScannerStats{
		Stream: s.cfg.Stream, Offset: s.commits.Committed(), Delivered: s.delivered.Load(),
		DeadLettered: s.deadLettered.Load(), Retries: s.retries.Load(), Forwarded: s.forwarded.Load(),
		Cancelled:    s.cancelledN.Load(),
		Pending:      sat(s.lastSeq.Load(), s.commits.Committed()),
		CommitLag:    sat(s.commits.Committed(), s.commits.Acked()),
		OldestDueAge: s.oldestDueAge(),
		LastLateness: time.Duration(s.lastLateness.Load()),
		ClockBound:   s.srv.lead(),
		Steps:        s.steps.Load(),
		Owner:        s.owned.Load(),
		Epoch:        s.epoch.Load(),
		FencedWrites: s.fencedWrites.Load(),
	}
}

// errNotOwner stops a scanner or the router whose lease term ended (or
// whose offset commit was fenced): another replica owns the work now.
var errNotOwner = errors.New("this replica no longer holds the lease")

// errLeaderless is a scanner start's error while the level stream has no
// leader: its start is retried.
var errLeaderless = errors.New("level stream has no leader (a follower answered its info; its state may lag): retrying")

// runTerm runs the scanner for one term of its level's lease: until ctx is
// done (a stop, or the term's end) or the scanner finds its term no longer
// valid. It confirms what is in flight and commits on the way out, like
// [Scanner.Run]; the elector releases the lease after it returns. For the
// term it serves the level's decide subject ([contract.DecideSubject]),
// and stops serving it before it returns, so before the release.
func (s *Scanner) runTerm(ctx context.Context, t leadership.Term) error {
	s.term, s.fencedStop = t, false
	s.epoch.Store(t.Epoch)
	s.decides.Store(false)
	s.owned.Store(true)
	stopDecide := s.serveDecide(ctx, t)
	defer func() {
		stopDecide()
		s.decides.Store(false)
		s.owned.Store(false)
		s.headDue.Store(0) // not this replica's head any more: never "stalled"
	}()
	return s.Run(ctx)
}

// owns reports whether the scanner may hand off (publish, forward,
// dead-letter) now: its lease term is valid (an exact check on the
// monotonic clock: a mutex and a clock read per hand-off) and no offset
// commit was fenced. A hand-off after the fence can only come from a pause
// between this check and the publish, one per level; README "Guarantees"
// ("A restart after a crash waits the lease TTL") states that bounded
// duplicate window. The offset cannot go wrong even then: every commit is
// a compare-and-set.
func (s *Scanner) owns() bool { return !s.fencedStop && s.term.Held() }

// Run delivers until ctx is done. On the way out it confirms what is in
// flight, commits the offset and returns nil. It survives server restarts,
// retrying with capped, jittered backoff.
func (s *Scanner) Run(ctx context.Context) error {
	reader, err := jswire.NewBatchReader(s.nc, s.cfg.Batch)
	if err != nil {
		return err
	}
	s.reader = reader
	defer reader.Close()
	acks, err := jswire.NewPubAcks(s.nc, s.ackTimeout)
	if err != nil {
		return err
	}
	acks.FailOnDisconnect()
	if s.loseAcks != nil {
		acks.LoseReplies(s.loseAcks)
	}
	s.acks = acks
	defer acks.Close() // after shutdown has confirmed what is in flight
	s.feed = newFeed(s.nc, s.js, s.cfg.Stream, s.cfg.Batch, s.cfg.BatchBytes)
	defer s.feed.close()
	jctx, stopJanitor := context.WithCancel(ctx)
	janitorDone := make(chan struct{})
	go func() { defer close(janitorDone); s.runJanitor(jctx) }()
	defer func() { stopJanitor(); <-janitorDone }()
	defer s.shutdown()

	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	s.restart = true
	for {
		if s.restart {
			// At start, and whenever the level stream is not the one the
			// offset belongs to (deleted, or deleted and recreated).
			if err := s.start(ctx); err != nil {
				if ctx.Err() != nil || errors.Is(err, errNotOwner) {
					return nil
				}
				s.logger.Warn("scanner start failed; retrying", slog.Any("error", err))
				if !backoff.sleep(ctx) {
					return nil
				}
				continue
			}
			s.restart = false
			backoff.reset()
		}
		s.steps.Add(1)
		err := s.step(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errNotOwner) || s.fencedStop {
			return nil // logged where it was found
		}
		if err != nil {
			s.logger.Warn("scanner step failed; retrying", slog.Any("error", err))
			if !backoff.sleep(ctx) {
				return nil
			}
			continue
		}
		backoff.reset()
	}
}

// start loads the offset and checks it against the stream's state,
// correcting one that makes no sense.
func (s *Scanner) start(outer context.Context) error {
	s.decides.Store(false)
	ctx, cancel := context.WithTimeout(outer, opTimeout)
	defer cancel()
	// An offset write of the previous start lands before the offset is
	// loaded (and corrected if it belongs to a deleted stream).
	if err := s.commits.Settle(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	stream, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return fmt.Errorf("level stream: %w", err)
	}
	if leaderless(stream.CachedInfo()) {
		// Its state may lag the stream's: an offset past a lagging last
		// sequence would be "corrected" backwards.
		return errLeaderless
	}
	s.stream, s.created = stream, stream.CachedInfo().Created
	s.head = nil
	s.win.reset()
	s.freshFrom(stream.CachedInfo())
	st := stream.CachedInfo().State
	first := st.FirstSeq // with no messages, FirstSeq is LastSeq+1
	if first == 0 {
		first = 1
	}
	off, rev, err := s.loadOffset(ctx)
	if errors.Is(err, offsets.ErrFenced) {
		// Another owner wrote the key between the read and the bump.
		s.fenced()
		return errNotOwner
	}
	// Every correction is logged with what was found and what it means
	// (README "Offsets that make no sense"): delivering from first again
	// repeats whatever of first..last was delivered but not yet purged.
	// Under a lease it is a compare-and-set at the revision just read.
	correct := func(seq uint64, reason string) error {
		if !s.cfg.fenced {
			return s.cfg.Offsets.Correct(ctx, s.cfg.Stream, seq, reason)
		}
		var cerr error
		rev, cerr = s.cfg.Offsets.CorrectAt(ctx, s.cfg.Stream, seq, rev, reason)
		if errors.Is(cerr, offsets.ErrFenced) {
			s.fenced()
			return errNotOwner
		}
		return cerr
	}
	again := redeliveryNote(first, st.LastSeq)
	if err == nil && s.replaced {
		// The stored offset counts the deleted stream's sequences.
		reason := fmt.Sprintf("offset %d belongs to a level stream deleted while delayd ran; %s", off, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
		s.replaced = false
	}
	switch {
	case errors.Is(err, offsets.ErrDeleted):
		// Deleted or purged by hand: it was committed once.
		off = first - 1
		if err := correct(off, err.Error()+"; "+again); err != nil {
			return err
		}
	case errors.Is(err, offsets.ErrNotFound) && first > 1:
		// No key and no trace of one, but only a scanner (after a commit)
		// or an operator purges a level stream: it was scanned before, and
		// the bucket lost the key (its stream purged, or the bucket
		// deleted and recreated).
		off = first - 1
		reason := fmt.Sprintf("no offset stored, but the stream was purged up to sequence %d, so it was delivered from before; %s", first-1, again)
		if err := correct(off, reason); err != nil {
			return err
		}
	case errors.Is(err, offsets.ErrNotFound):
		// A new level stream: never purged, so nothing was delivered from
		// it that a stored offset or its delete marker would not show.
		off = first - 1
		s.logger.Debug("new level stream: no offset yet", slog.Uint64("messages", st.Msgs))
	case errors.Is(err, offsets.ErrCorrupt):
		off = first - 1
		if err := correct(off, err.Error()+"; "+again); err != nil {
			return err
		}
	case err != nil:
		return err
	case off > st.LastSeq:
		// The stream was recreated, or the offset was set by hand past its end.
		reason := fmt.Sprintf("offset %d beyond the stream's last sequence %d; %s", off, st.LastSeq, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
	case off+1 < first:
		// Messages up to first-1 were purged, so they were delivered.
		reason := fmt.Sprintf("offset %d below the stream's first sequence %d: sequences up to %d were purged, so delivered; %s", off, first, first-1, again)
		off = first - 1
		if err := correct(off, reason); err != nil {
			return err
		}
	}
	s.passed.Store(off)
	s.startTail, s.startedAt = st.LastSeq, s.srv.now()
	s.offset, s.purgedTo = off, first
	s.commits.ResetAt(off, rev)
	s.tombsAcked = off // loadTombstones drops those up to off
	s.next = off + 1
	s.resetFeed = true
	s.Written(st.LastSeq)
	s.grace.started(s.nc.Stats().Reconnects)
	s.coreUnflushed = false
	s.progress()
	s.logger.Debug("scanner started", slog.Uint64("offset", off), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("pending", st.LastSeq-off))
	if s.tombstones, err = s.js.Stream(ctx, CancelStream); err != nil {
		return fmt.Errorf("cancel tombstones: %w", err)
	}
	// Not within start's timeout: a level may hold many cancelled messages.
	if err := s.loadTombstones(outer, off); err != nil {
		return err
	}
	s.decides.Store(true)
	return nil
}

// loadOffset loads the level's committed offset and, as its owner under a
// lease, bumps the offset key first (offsets.Store.Bump): a previous
// owner's next commit then fails its compare-and-set. revision is the
// key's revision to commit at (0 if unknown or never written). Errors as
// offsets.Store.Load; a write between the read and the bump wraps
// offsets.ErrFenced. It refuses to write for a term no longer valid.
func (s *Scanner) loadOffset(ctx context.Context) (offset, revision uint64, err error) {
	if !s.cfg.fenced {
		offset, err = s.cfg.Offsets.Load(ctx, s.cfg.Stream)
		return offset, 0, err
	}
	if !s.owns() {
		return 0, 0, errNotOwner
	}
	return s.cfg.Offsets.Bump(ctx, s.cfg.Stream)
}

// redeliveryNote says what a correction to first-1 means for a level stream
// holding sequences first..last: each of them that was delivered already
// (the kept last delivered message, and what a crash left unpurged) is
// delivered again.
func redeliveryNote(first, last uint64) string {
	if last < first {
		return "the stream holds no messages: nothing is delivered again"
	}
	return fmt.Sprintf("delivering from sequence %d: messages %d..%d that were delivered already are delivered again", first, first, last)
}

// step delivers the head if it is due, or waits for it.
func (s *Scanner) step(ctx context.Context) error {
	s.serveCancels()
	if s.resetFeed {
		if !s.sameStream(ctx) {
			return nil
		}
		if err := s.feed.reset(ctx, s.next); err != nil {
			return err
		}
		s.resetFeed, s.head, s.feedFresh = false, nil, true
	}
	if s.head == nil {
		m, meta, err := s.feed.next(ctx, nil, false, 0)
		if err == nil && m == nil {
			// Nothing buffered: confirm and commit before blocking. A
			// failed delivery that was rewound is still the due head.
			if !s.quiesce(ctx, !s.win.probing) {
				return nil // a delivery failed and was rewound
			}
			if s.commits.Committed() > s.purgedTo {
				// A purge is due once the level has been quiet a moment.
				if m, meta, err = s.feed.next(ctx, s.wake, true, s.cfg.PurgeEvery); err == nil && m == nil {
					s.settleCommit(ctx) // acknowledged by now, normally: the purge goes up to it
					s.purge(ctx, true)
				}
			}
			if err == nil && m == nil {
				m, meta, err = s.feed.next(ctx, s.wake, true, 0)
			}
		}
		if errors.Is(err, jswire.ErrWoken) {
			return nil // a cancel request: decided at the top of the next step
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.settle(ctx)
			s.resetFeed = true
			return err
		}
		if meta.StreamSeq < s.next {
			return nil // read again after a reset
		}
		fresh := s.feedFresh
		s.feedFresh = false
		if meta.StreamSeq > s.next && !fresh {
			// A level stream has no gaps above its purged prefix, so a
			// sequence skipped mid-stream was lost on the way (a full
			// client buffer): read again from next.
			s.logger.Warn("level stream read skipped a sequence; reading again", slog.Uint64("want", s.next), slog.Uint64("got", meta.StreamSeq))
			s.resetFeed = true
			return nil
		}
		s.head, s.headMeta = m, meta
		s.observeClock(ctx, meta.StreamSeq, meta.Stored)
	}
	m, seq := s.head, s.headMeta.StreamSeq
	if s.win.skipDone(seq) {
		// Confirmed before an earlier delivery failed: not sent again.
		s.head = nil
		s.next = seq + 1
		return nil
	}
	if isMarker(m.Subject) {
		// A router's epoch marker (marker.go): never delivered nor
		// counted; the offset passes it in order, like a cancelled one.
		s.head = nil
		s.next = seq + 1
		s.passed.Store(seq)
		s.win.passOver(seq)
		s.afterPublish(ctx)
		return nil
	}
	if s.skipCancelled(m, seq) {
		s.afterPublish(ctx)
		return nil
	}
	// The view of the head, asking only what decide reads (see headView).
	target, due := s.parse(m, s.headMeta.Stored)
	v := headView{due: due}
	if s.srv.stale() {
		s.refreshClock(ctx)
	}
	v.now = s.srv.now()
	v.hopDue, v.hop = s.hopDue(m)
	if when := v.waitsFor(); when.After(v.now) && s.srv.uncertain(when) {
		// Due but for the drift allowed since an older observation.
		s.refreshClock(ctx)
		v.now = s.srv.now()
	}
	if !v.hop {
		v.bound = s.cfg.Targets.bound(target)
	}
	if v.coreDue() {
		if v.disconnected = !s.nc.IsConnected(); v.disconnected {
			s.grace.disconnected() // the next look starts the grace
		} else {
			// A reconnect this scanner saw happen, or one that happened
			// while it slept (the reconnect count, looked at no more than
			// every 50 ms), starts the grace for what fell due meanwhile.
			s.grace.look(func() uint64 { return s.nc.Stats().Reconnects })
		}
	}
	if !v.hop && !v.bound && !v.disconnected {
		v.grace = s.grace.hold(v.due, v.now)
	}
	a := v.decide()
	if !a.handOff() {
		if !a.idle() {
			s.headFellDue(a.fellDue) // held: a due head, and no progress
		}
		if !s.quiesce(ctx, a.idle()) {
			return nil // a delivery failed and was rewound: read it again
		}
		return s.sleep(ctx, a.wait)
	}
	// A due head: a hand-off (moving on, for a hop) that keeps failing
	// stalls the level.
	s.headFellDue(a.fellDue)
	if s.cancelHolds(ctx, seq) {
		return nil // looked at again: skipped if cancelled
	}
	if held, err := s.cfg.gate.holds(ctx, seq); held != "" {
		// Routed under the level's current partition count while an older
		// message of the level waits in another stream: it goes first.
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("partition order check failed; holding the head", slog.Any("error", err))
		}
		if held != s.gateHeld {
			s.gateHeld = held
			s.logger.Info("holding the level's new messages until an older partition's are delivered", slog.String("older", held), slog.Uint64("seq", seq))
		}
		if !s.quiesce(ctx, false) {
			return nil
		}
		return s.sleep(ctx, orderGatePoll)
	}
	if !s.owns() {
		// Checked once per hand-off, after any wait: the head stays
		// unpassed for the next owner.
		s.logger.Info("level stopped: this replica's lease term ended", slog.Uint64("epoch", s.term.Epoch), slog.Uint64("seq", seq))
		return errNotOwner
	}
	s.head = nil
	s.next = seq + 1
	s.passed.Store(seq)
	if a.kind == headForward {
		if err := s.forward(ctx, m, seq, target, v.due); err != nil {
			return err
		}
	} else {
		s.lastLateness.Store(int64(a.lateness))
		if s.cfg.OnDelivery != nil {
			s.cfg.OnDelivery(a.lateness)
		}
		if err := s.publish(ctx, m, seq, target, v.bound); err != nil {
			return err
		}
	}
	s.afterPublish(ctx)
	return nil
}

// afterPublish confirms deliveries as the window requires.
func (s *Scanner) afterPublish(ctx context.Context) {
	switch {
	case s.win.probing:
		s.settle(ctx)
	case s.win.full():
		s.settleFirst(ctx, s.cfg.Window/2)
		s.purge(ctx, false)
	}
}

// hopDue returns when a cascading message's wait at this level ends, if it
// has more to wait after it.
func (s *Scanner) hopDue(m *nats.Msg) (time.Time, bool) {
	v := m.Header.Get(hdrHopDue)
	if v == "" {
		return time.Time{}, false
	}
	t, err := parseTime(v)
	return t, err == nil
}

// forward moves a cascading message on: it is published to the ingress
// stream again with Delay-Deliver-At set to its due time, so the router
// places it at the level for what remains. The write is confirmed by its
// PubAck like a delivery to a stream; its Nats-Msg-Id (hopKey.hopID: first
// id and hop number, keyed by delayd's secret) makes the ingress stream drop
// a repeat after a crash. The message keeps its first id, enqueue time and
// publisher id.
func (s *Scanner) forward(ctx context.Context, m *nats.Msg, seq uint64, target string, due time.Time) error {
	h := m.Header
	origin := h.Get(hdrOrigin)
	if origin == "" {
		origin = h.Get(hdrIngress)
	}
	hops, _ := strconv.Atoi(h.Get(hdrHops))
	hops++
	userID, enqueued, merge, partKey := h.Get(hdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(hdrMerge), h.Get(hdrPartKey)
	stripInternal(h)
	delete(h, contract.HeaderDueAt)
	h[contract.HeaderDeliverAt] = []string{contract.FormatTime(due)}
	h[contract.HeaderEnqueuedAt] = []string{enqueued}
	h[hdrOrigin] = []string{origin}
	h[hdrHops] = []string{strconv.Itoa(hops)}
	if userID != "" {
		h[hdrMsgID] = []string{userID}
	}
	if merge != "" {
		h[hdrMerge] = []string{merge}
	}
	if partKey != "" {
		h[contract.HeaderPartitionKey] = []string{partKey}
	}
	h[contract.HeaderNatsMsgID] = []string{s.cfg.hopKey.hopID(origin, hops)}
	m.Subject, m.Reply, m.Sub = s.cfg.Prefix+"."+target, "", nil
	s.cfg.hopKey.sign(m.Subject, h)
	fut, err := s.acks.Publish(m)
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused before sending: confirm what precedes it, then dead-letter.
			s.settle(ctx)
			if s.next == seq+1 {
				s.deadLetter(ctx, m, seq, fmt.Errorf("%w: the cascading message exceeds the server's max payload", ErrTooLarge))
			}
			return nil
		}
		s.next, s.head, s.resetFeed, s.win.probing = seq, nil, true, true
		return fmt.Errorf("forward to %q: %w", m.Subject, err)
	}
	s.forwarded.Add(1)
	s.win.add(delivery{seq: seq, target: m.Subject, fut: fut, hop: true})
	return nil
}

// quiesce readies the scanner to wait: it confirms and commits what is in
// flight and purges the delivered prefix. With idle set (the head is not due,
// or there is none) it marks the level as holding no due head. It returns
// false if a delivery failed and was rewound, in which case the caller must
// read again instead of waiting.
func (s *Scanner) quiesce(ctx context.Context, idle bool) bool {
	next := s.next
	s.settle(ctx)
	if s.next != next {
		return false
	}
	s.purge(ctx, false)
	if idle {
		s.noDueHead()
	}
	return true
}

// parse returns a level message's target and due time. A message without a
// readable Delay-Due-At (written by hand) is due at its level-stream store
// time plus the stream's delay, never earlier than the contract's due.
func (s *Scanner) parse(m *nats.Msg, stored time.Time) (string, time.Time) {
	target := strings.TrimPrefix(m.Subject, s.subject)
	due, err := parseTime(m.Header.Get(contract.HeaderDueAt))
	if err != nil {
		due = stored.Add(s.delay)
		s.logger.Warn("level message without a valid due time; using its store time plus the level's delay", slog.String("value", m.Header.Get(contract.HeaderDueAt)))
	}
	return target, due
}

// publish hands one message to its target: a JetStream publish if bound to
// a stream, else a core publish.
func (s *Scanner) publish(ctx context.Context, m *nats.Msg, seq uint64, target string, bound bool) error {
	s.deliveryHeaders(m.Header)
	m.Subject, m.Reply, m.Sub = target, "", nil
	d := delivery{seq: seq, target: target}
	var err error
	if bound {
		d.fut, err = s.acks.Publish(m)
	} else {
		if !s.coreUnflushed {
			// The first core publish since the last flush: the connection
			// it goes out on, by its reconnect count.
			s.coreUnflushed, s.coreReconnects = true, s.nc.Stats().Reconnects
		}
		err = s.nc.PublishMsg(m)
	}
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused before sending: confirm what precedes it, then dead-letter.
			s.settle(ctx)
			if s.next != seq+1 {
				return nil // an earlier delivery failed; this one is read again
			}
			s.deadLetter(ctx, m, seq, fmt.Errorf("%w: the delivery exceeds the server's max payload", ErrTooLarge))
			return nil
		}
		// Not sent: rewind so it is read and tried again. It stays the
		// due head (probing) until it is handed off.
		s.next, s.head, s.resetFeed, s.win.probing = seq, nil, true, true
		return fmt.Errorf("publish to %q: %w", target, err)
	}
	s.win.add(d)
	return nil
}

// deliveryHeaders turns a level message's headers into those its target
// receives (README "What the target receives"): the internal headers
// removed, Nats-Msg-Id set to the publisher's id or, without one, to the
// delivery id derived from the first ingress reference, and Delay-Hops set
// to the hops a cascading message made.
//
// It allocates nothing for a message with a publisher id, and only the
// derived id's string otherwise: each value set is the slice of the
// internal header it comes from (the client decodes every header into a
// slice of its own), moved to its new key before that header is removed.
func (s *Scanner) deliveryHeaders(h nats.Header) {
	id := h[hdrMsgID]
	if len(id) == 0 || id[0] == "" {
		// No publisher id: derived from the first ingress reference, made
		// unguessable.
		id = h[hdrOrigin]
		if len(id) == 0 || id[0] == "" {
			id = h[hdrIngress]
		}
		if len(id) > 0 && id[0] != "" {
			if s.idMAC == nil {
				s.idMAC = s.cfg.hopKey.newIDMAC()
			}
			id[0] = s.idMAC.deliveryID(id[0])
		}
	}
	hops := h[hdrHops]
	stripInternal(h)
	if len(id) > 0 && id[0] != "" {
		h[contract.HeaderNatsMsgID] = id[:1]
	}
	if len(hops) > 0 && hops[0] != "" {
		h[contract.HeaderHops] = hops[:1]
	}
}

// settle confirms every in-flight delivery in order and commits the offset
// up to the first failure. After a failure the scanner rewinds to the failed
// delivery and probes: it sends one delivery at a time, with capped backoff,
// until the target takes it. Deliveries after the failed one that were
// confirmed anyway are remembered and not sent again, so a failing target
// costs no flood of re-deliveries.
func (s *Scanner) settle(ctx context.Context) { s.settleFirst(ctx, len(s.win.inflight)) }

// settleFirst confirms the oldest n in-flight deliveries and commits the
// offset past them, leaving the rest in flight so the pipeline to the
// target never drains while the window is full. A failure among them
// settles everything, as settle does.
func (s *Scanner) settleFirst(ctx context.Context, n int) {
	if len(s.win.inflight) == 0 {
		s.commit(ctx)
		return
	}
	if n < len(s.win.inflight) && s.win.firstFailure(n) {
		n = len(s.win.inflight)
	}
	// Deliveries already sent are confirmed even when ctx ends (a stop):
	// on a fresh context bounded by opTimeout, keeping ctx's values.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	// One flush confirms every core publish sent before it; it is done the
	// first time a core delivery needs confirming.
	var (
		flushed  bool
		flushErr error
	)
	flush := func() error {
		if !flushed {
			flushed = true
			before := s.nc.LastError()
			sent := s.nc.Stats().Reconnects
			flushErr = s.nc.FlushWithContext(cctx)
			// A flush confirms what the server received on the connection
			// its PING went out on. Core publishes sent on an earlier
			// connection (since the last flush) may have been lost with
			// it, and a flush sent while reconnecting completes on the new
			// one: neither confirms them, so they are delivered again
			// (README "Guarantees": a core subscriber may see a window
			// again after a reconnect).
			done := s.nc.Stats().Reconnects
			if flushErr == nil && s.coreUnflushed && (s.coreReconnects != sent || done != sent) {
				flushErr = errReconnected
			}
			s.coreUnflushed = false
			// The server answers a refused publish with -ERR before the
			// flush's PONG, and the client records it as LastError.
			if e := s.nc.LastError(); e != before {
				s.cfg.Targets.NoteError(e)
			}
		}
		return flushErr
	}
	var (
		failed    delivery
		failedErr error
	)
	for i := 0; i < n; i++ {
		d := s.win.inflight[i]
		var err error
		switch {
		case d.confirmed:
		case d.fut == nil:
			err = flush()
			if err == nil && s.cfg.Targets.refused(d.target) {
				err = fmt.Errorf("%w: publish to %q", ErrPermissionDenied, d.target)
			}
		default:
			<-d.fut.Done() // a PubAck, an error, or the tracker's timeout
			_, err = d.fut.Result()
			if err != nil && s.cfg.Targets.refused(d.target) {
				err = fmt.Errorf("%w: publish to %q: %v", ErrPermissionDenied, d.target, err)
			}
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
				// Nobody answered: the target's stream may be gone, or be
				// electing a leader. Only if the refreshed index says no
				// stream captures the subject is it a core subject without
				// interest, delivered to no one; otherwise it is retried.
				s.cfg.Targets.forget(d.target)
				if rerr := s.cfg.Targets.Refresh(cctx); rerr == nil && !s.cfg.Targets.bound(d.target) {
					err = nil
				}
			}
		}
		switch s.win.record(d, err, failedErr != nil) {
		case outFailed:
			failed, failedErr = d, err
			// Everything behind it is settled too, so that the rewind
			// leaves nothing in flight and successes are remembered.
			n = len(s.win.inflight)
		case outPassed:
			s.offset = d.seq
			s.headDue.Store(0)
			s.progress()
			if !d.confirmed && !d.hop {
				s.delivered.Add(1)
			}
		case outRemembered:
			if !d.hop {
				s.delivered.Add(1)
			}
		}
	}
	s.win.drop(n)
	s.commit(ctx)
	if failedErr == nil {
		s.win.probing = false
		return
	}
	s.failed(ctx, failed, failedErr)
}

// failed handles the first delivery of a window that was not confirmed: it
// is dead-lettered when its target refused it permanently and often enough,
// otherwise retried after a capped backoff.
func (s *Scanner) failed(ctx context.Context, d delivery, err error) {
	s.next, s.head, s.resetFeed = d.seq, nil, true
	n := s.win.failedAgain(d.seq)
	s.retries.Add(1)
	if permanent(err) && n >= s.cfg.MaxAttempts {
		// Its dead letter is written even when ctx ends (see deadLetter),
		// so it is read on a fresh context bounded by opTimeout.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		buf, rerr := s.reader.Read(rctx, s.cfg.Stream, nil, d.seq, 1, 1)
		cancel()
		if rerr == nil && len(buf) == 1 {
			if seq, _ := strconv.ParseUint(buf[0].Header.Get(hdrJSSequence), 10, 64); seq == d.seq {
				s.win.forgetAttempts(d.seq)
				s.deadLetter(ctx, buf[0], d.seq, fmt.Errorf("target %q refused it %d times: %w", d.target, n, err))
				return
			}
		}
	}
	// The first attempt and every 10th at warn, the others at debug: a target
	// that refuses for minutes logs a line a minute, not one per retry.
	logLevel := slog.LevelWarn
	if n > 1 && n%10 != 0 {
		logLevel = slog.LevelDebug
	}
	s.logger.Log(ctx, logLevel, "delivery failed; retrying", slog.String("target", d.target), slog.Uint64("seq", d.seq), slog.Int("attempt", n), slog.Any("error", err))
	s.backoff.cur = min(time.Duration(n)*100*time.Millisecond, 5*time.Second)
	s.backoff.sleep(ctx)
}

// permanent reports whether a target's refusal will not change on retry:
// too large for it, or not permitted.
func permanent(err error) bool { return tooLarge(err) || errors.Is(err, ErrPermissionDenied) }

// stripInternal removes every header a level-stream message carries for
// JetStream or delayd only: the direct-get headers, the router's
// Nats-Expected-Last-Sequence and the reserved Delayd-* headers. The router
// already removed publishers' Nats-* instructions, so no Nats-* header may
// reach a target except the Nats-Msg-Id the caller sets.
func stripInternal(h nats.Header) {
	for k := range h {
		if contract.IsInternalHeader(k) {
			delete(h, k)
		}
	}
}

// deadLetter writes a level message that cannot be delivered to DELAYD_DLQ,
// retrying until it is stored, and then counts it as confirmed so the offset
// moves past it in order. m is either as read from the level stream or
// already prepared for delivery.
func (s *Scanner) deadLetter(ctx context.Context, m *nats.Msg, seq uint64, reason error) {
	id := m.Header.Get(hdrIngress)
	if id == "" {
		id = m.Header.Get(contract.HeaderNatsMsgID) // already prepared for delivery
	}
	subject := strings.TrimPrefix(m.Header.Get(hdrJSSubject), s.subject)
	if subject == "" {
		subject = m.Subject
	}
	_, hopping := m.Header[hdrHopDue]
	hopping = hopping || m.Header.Get(contract.HeaderDeliverAt) != "" // prepared to move on (forward)
	key, merge := levelKey(m.Header), m.Header.Get(hdrMerge)
	dl := deadLetterMsg(subject, m.Header, m.Data, reason, id)
	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		// Each attempt finishes even when ctx ends (a stop), bounded by
		// opTimeout in publishDeadLetter; ctx ends the retries below.
		err := publishDeadLetter(context.WithoutCancel(ctx), s.js, dl)
		if err == nil {
			s.cfg.refused.stored(s.cfg.Stream)
			break
		}
		// Nothing passes it until its dead letter is stored: the level
		// waits (and reports itself stalled), the other levels go on.
		logLevel := slog.LevelError // the first refusal; its retries at debug
		if !s.cfg.refused.refused(s.cfg.Stream, err) {
			logLevel = slog.LevelDebug
		}
		s.logger.Log(ctx, logLevel, "dead-letter write failed; retrying", slog.Uint64("seq", seq), slog.Any("error", err))
		if !backoff.sleep(ctx) {
			s.cfg.refused.stored(s.cfg.Stream) // not waiting any more: read again at the next start
			// Stopping: the message stays past the offset and is read,
			// and dead-lettered, again on the next start.
			s.next, s.head, s.resetFeed = min(s.next, seq), nil, true
			return
		}
	}
	if hopping {
		// Its index record still says it moves on: say it left delayd, so a
		// cancel answers "not found" and its merge key is free.
		s.leftDelayd(ctx, key, merge, strings.TrimPrefix(subject, s.cfg.Prefix+"."))
	}
	s.logger.Warn("dead-lettered undeliverable message", slog.String("target", subject), slog.Uint64("seq", seq), slog.String("error", reason.Error()))
	s.deadLettered.Add(1)
	s.cfg.reasons.add(reasonOf(reason))
	s.next = max(s.next, seq+1)
	s.passed.Store(max(s.passed.Load(), seq))
	s.win.passOver(seq)
	s.settle(ctx)
}

// commit hands the offset to the committer if it moved, without waiting:
// the write is pipelined behind the deliveries it confirms (one in flight,
// the latest offset next; see [offsets.Committer]).
func (s *Scanner) commit(ctx context.Context) {
	s.noteAcked()
	// Once a write failed its compare-and-set, every Commit returns the
	// fence (the next one after the failure at the latest).
	err := s.commits.Commit(ctx, s.offset)
	switch {
	case errors.Is(err, offsets.ErrFenced):
		s.fenced()
	case err != nil:
		s.logger.Warn("offset commit failed", slog.Uint64("offset", s.offset), slog.Any("error", err))
	}
}

// fenced stops the level: an offset commit failed its compare-and-set, so
// another owner wrote the offset. Logged and counted once per term.
func (s *Scanner) fenced() {
	if s.fencedStop {
		return
	}
	s.fencedStop = true
	s.fencedWrites.Add(1)
	s.logger.Warn("level stopped: its offset was written by another owner (fenced)", slog.Uint64("epoch", s.term.Epoch), slog.Uint64("offset", s.offset))
}

// settleCommit waits, at most opTimeout, until the committed offset is
// acknowledged (or its write failed; the committer logged it). The scanner
// calls it when idle, before a purge: the commit lag reads 0 while idle.
func (s *Scanner) settleCommit(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	_ = s.commits.Settle(cctx)
	cancel()
	s.noteAcked()
}

// noteAcked drops the tombstones of cancelled messages the acknowledged
// offset passed: they are no longer needed.
func (s *Scanner) noteAcked() {
	if a := s.commits.Acked(); a != s.tombsAcked {
		s.tombsAcked = a
		s.dropTombstones(a)
	}
}

// sleep waits d, or until ctx is done or a cancel request wakes the scanner.
func (s *Scanner) sleep(ctx context.Context, d time.Duration) error { return sleepWake(ctx, s.wake, d) }

// purge removes the delivered prefix up to the acknowledged offset,
// keeping the message at it: a purge never passes an offset the KV bucket
// has not stored.
func (s *Scanner) purge(ctx context.Context, idle bool) {
	mono := s.cfg.Clock.Mono()
	acked := s.commits.Acked()
	if ctx.Err() != nil || acked <= s.purgedTo || (!idle && mono-s.lastPurge < s.cfg.PurgeEvery) {
		return
	}
	s.lastPurge = mono // a failing purge is not retried in a tight loop either
	// The offset belongs to one life of the stream: purging by it a stream
	// that was deleted and recreated would destroy undelivered messages.
	if !s.sameStream(ctx) {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.stream.Purge(pctx, jetstream.WithPurgeSequence(acked)); err != nil {
		s.logger.Warn("purge failed", slog.Uint64("below", acked), slog.Any("error", err))
		return
	}
	s.purgedTo = acked
}

// sameStream reports whether the level stream is still the one the scanner
// started on. If it was deleted, or deleted and recreated, the scanner
// starts over (offset checked against the new stream) and it returns false.
func (s *Scanner) sameStream(ctx context.Context) bool {
	ictx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	info, err := s.stream.Info(ictx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s.logger.Warn("level stream gone; starting over")
	case err != nil || leaderless(info):
		return true // unknown: the caller's own request will fail or succeed
	case !info.Created.Equal(s.created) || s.commits.Committed() > info.State.LastSeq:
		s.logger.Warn("level stream recreated; starting over")
	default:
		return true
	}
	s.restart, s.resetFeed, s.replaced = true, true, true
	return false
}

// shutdown confirms and commits what is in flight when Run ends. Run's
// context is done by then, so it works on fresh contexts, each bounded by
// opTimeout: one to confirm the deliveries and purge, one to wait for the
// offset write.
func (s *Scanner) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	s.settle(ctx)
	cctx, ccancel := context.WithTimeout(context.Background(), opTimeout)
	if err := s.commits.Settle(cctx); err != nil && cctx.Err() != nil {
		s.logger.Warn("offset commit unconfirmed at shutdown", slog.Uint64("offset", s.commits.Committed()))
	}
	ccancel()
	if s.commits.Fenced() {
		s.fenced() // a commit refused after the term ended, or before a Commit saw it
	}
	s.noteAcked()
	s.purge(ctx, true) // the delivered prefix goes with a clean stop
	s.logger.Debug("scanner stopped", slog.Uint64("offset", s.commits.Committed()))
}

// leaderless reports whether a stream info was answered by a member of a
// replicated stream's group while the group had no leader. nats-server lets
// such a follower answer with its own state, which may lag the stream's:
// a lower last sequence (an offset past it would look like a recreated
// stream) or an older first sequence. A scanner decides nothing from it.
// (A clustered leader's info names it in Cluster.Leader; a standalone
// server names itself.)
func leaderless(info *jetstream.StreamInfo) bool {
	return info != nil && info.Cluster != nil && info.Cluster.Leader == ""
}

func sleepCtx(ctx context.Context, d time.Duration) error { return sleepWake(ctx, nil, d) }

// sleepWake waits d, or until ctx is done (its error) or wake receives
// (nil; a nil wake never does).
func sleepWake(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-wake:
	}
	return nil
}

// leftDelayd writes "left delayd" index records (no placement) for a
// message's id key and merge key, and frees the merge key in the router.
func (s *Scanner) leftDelayd(ctx context.Context, key, merge, target string) {
	recs := []index.Record{{Key: key, Target: target}}
	if merge != "" {
		recs = append(recs, index.Record{Key: index.MergeKey(target, merge), Target: target})
	}
	for _, rec := range recs {
		if rec.Key == "" {
			continue
		}
		// Written even when ctx ends: the message did leave delayd.
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		_, err := s.js.PublishMsg(ictx, rec.Msg())
		cancel()
		if err != nil {
			s.logger.Warn("id index write failed", slog.Any("error", err))
		}
		if index.IsMergeKey(rec.Key) && s.cfg.mergeGone != nil {
			s.cfg.mergeGone(rec)
		}
	}
}
