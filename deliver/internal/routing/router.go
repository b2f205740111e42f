package routing

import (
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
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/levels"
)

// Router defaults.
const (
	// MaxInFlightDefault bounds level-stream writes awaiting their PubAck.
	MaxInFlightDefault = 4096
	// BatchDefault is how many ingress messages are pulled ahead.
	BatchDefault = 1024
	// RouterConsumer is the durable name of the ingress consumer of a
	// router on its own ([NewStandalone]), and the prefix of a deliver.Service's,
	// which is per term of the router lease: "delayd-router-<epoch>"
	// ([RouterConsumerName]). Earlier versions used it unsuffixed; a new
	// term deletes that one too.
	RouterConsumer = "delayd-router"

	// StallAfterDefault is how long the router may go without progress
	// after its first failure before it reports itself unhealthy
	// ([Router.Healthy]); deliver.ScannerStallAfterDefault's value.
	StallAfterDefault = 30 * time.Second

	ingressAckWait = 30 * time.Second
)

// Config configures a [Router].
type Config struct {
	// Prefix is the ingress subject prefix. Required.
	Prefix string

	// Levels is the level table. Required.
	Levels levels.Table

	// Targets is the operator's target policy. Optional. Default allows all.
	Targets contract.TargetPolicy

	// Partitions splits levels of Levels into partition streams: a message
	// for a partitioned level goes to partition [levels.PartitionOf] of its
	// partition key (its Delay-Partition-Key, else its target subject).
	// Optional. Default: none. With ingress partitions
	// ([levels.Partitions.WithIngress], N above 1) the router routes
	// IngressPartition only, and writes only the level streams of that
	// partition (partition j of a level where j mod N is IngressPartition);
	// among those it picks by the partition key's hash.
	Partitions levels.Partitions

	// IngressPartition is the ingress partition the router routes, 0 to
	// N-1: its consumer reads the subjects "delayd.in.<IngressPartition>.>"
	// of DELAYD_INGRESS. Optional. Default 0 (the only one when ingress is
	// not partitioned).
	IngressPartition int

	// MaxDelay is the longest Delay-Duration, or Delay-Deliver-At ahead of
	// the ingress store time, delayd accepts. Optional. Default
	// [contract.MaxDelayDefault].
	MaxDelay time.Duration

	// Replicas for a level stream the router has to recreate because it was
	// deleted while delayd ran. Optional. Default 1.
	Replicas int

	// Logger is optional. Default discards.
	Logger *slog.Logger

	// MaxInFlight bounds level writes awaiting PubAck. Optional. Default
	// [MaxInFlightDefault].
	MaxInFlight int

	// Batch is how many ingress messages are pulled ahead. Optional. Default
	// [BatchDefault].
	Batch int
}

func (c *Config) setDefaults() {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = MaxInFlightDefault
	}
	if c.Batch == 0 {
		c.Batch = BatchDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = contract.MaxDelayDefault
	}
}

func (c *Config) validate() error {
	if c.Prefix == "" {
		return errors.New("deliver: router: Prefix is required")
	}
	if c.Levels.Len() == 0 {
		return errors.New("deliver: router: Levels is required")
	}
	if c.MaxInFlight < 1 || c.Batch < 1 {
		return errors.New("deliver: router: MaxInFlight and Batch must be positive")
	}
	if c.IngressPartition < 0 || c.IngressPartition >= c.Partitions.Ingress() {
		return fmt.Errorf("deliver: router: ingress partition %d: want 0 to %d", c.IngressPartition, c.Partitions.Ingress()-1)
	}
	if err := c.Targets.Validate(); err != nil {
		return fmt.Errorf("deliver: router: target policy: %w", err)
	}
	return nil
}

// Wiring is what a router shares with the rest of delayd. A
// deliver.Service fills it from its own state; [NewStandalone] fills it for a router
// on its own.
type Wiring struct {
	// Reasons counts dead letters by reason, shared with the scanners.
	// Required.
	Reasons *message.ReasonCounts

	// Refused tracks the dead letters DELAYD_DLQ refused, shared with the
	// scanners. Required.
	Refused *message.Refusals

	// HopKey authenticates hops: only a message whose hop MAC it verifies
	// keeps its first id, enqueue time and hop count. Required.
	HopKey hop.Key

	// Owners is the router's view of the level owners. Optional: nil
	// merges nothing (no owner can say a message is pending).
	Owners Owners

	// Offsets reads the level streams' committed offsets. Optional: nil
	// re-indexes every candidate at start.
	Offsets Offsets

	// Tails is told what the level streams hold after each confirmed level
	// write and each tail sync. Optional: nil tells nobody.
	Tails Tails

	// Merges holds the router's merge cache, its ingress partition's,
	// where the level owners forget the merge keys they free. Optional:
	// nil gives the router a cache of its own, which nothing else reaches.
	Merges *MergeCaches

	// LookupConn reads the id index for merge checks (deliver.Config.LookupConn:
	// the server walks the index inline on the reading connection).
	// Optional: nil reads on the router's own connection.
	LookupConn *nats.Conn
}

func (w *Wiring) validate() error {
	switch {
	case w.Reasons == nil:
		return errors.New("deliver: router: dead-letter reason counts are required")
	case w.Refused == nil:
		return errors.New("deliver: router: dead-letter refusals are required")
	case len(w.HopKey) == 0:
		return errors.New("deliver: router: a hop key is required")
	}
	return nil
}

// Stats are the router's counters since start.
type Stats struct {
	Routed       uint64 // messages written to a level stream and acked at ingress
	DeadLettered uint64 // invalid messages written to DELAYD_DLQ
	Clamped      uint64 // Delay-Level above the table, clamped to the highest level
	Skipped      uint64 // redeliveries already present in their level stream
	Merged       uint64 // messages merged into a pending one with the same merge key and target
	IndexErrors  uint64 // id index writes that failed (those messages cannot be cancelled)
	Owner        bool   // this replica holds the router lease and routes now
	Epoch        uint64 // the epoch of this replica's last term of the router lease; 0 if it never held it

	// IngressPartition is the ingress partition the router routes (0 when
	// ingress is not partitioned); Lease is its lease key, "router" or
	// "router.<IngressPartition>".
	IngressPartition int    `json:",omitempty"`
	Lease            string `json:",omitempty"`

	// FencedWrites counts, by level stream, the router's terms that ended
	// because a router of a newer term had written that level stream (its
	// epoch marker, or messages past this router's last write), also when
	// the refusal of a write expecting the old tail came after the term
	// ended; and under DELAYD_INGRESS, those that found a newer term's
	// ingress consumer. Each stopped the router in this process; each term
	// counts once.
	FencedWrites map[string]uint64 `json:",omitempty"`
}

// Router consumes DELAYD_INGRESS and writes each message to its level
// stream, or to DELAYD_DLQ with the reason when it is invalid.
//
// Exactly-once into level streams without a duplicate window: the router is
// the only writer of each level stream (one at a time: the router lease, and
// the epoch markers of marker.go that refuse a stale router's writes) and
// writes with Nats-Expected-Last-Sequence, so a level stream holds its
// messages in strict ingress order. The ingress message is acked only after the level write's
// PubAck. After a crash or a failed write, the router reads the ingress
// sequence of each level stream's last message (the scanners never purge a
// level stream's last message): any ingress message at or below it is
// already stored and is only acked. This costs no server memory per message,
// unlike a Nats-Msg-Id duplicate window.
//
// Its parts: a pure classifier (classify.go) decides each message's
// placement; the write pipeline (pipeline.go) sends the writes and confirms
// them in order on its acker and confirmer goroutines; the merge cache
// (mergecache.go) remembers merge keys' placements under its own lock; a
// tail sync (tailsync.go) reads a level stream's tail and re-indexes it.
//
// Goroutines. Router's methods run on two: the session goroutine, which
// calls [Router.Run] (or [Router.RunTerm]), and the write pipeline's
// confirmer, which runs the [ackSink] methods (writeConfirmed,
// writeRefused, tailSynced) and what they call (confirmMerges,
// deferDeadLetter, fail, ingressRef). [Router.Stats], [Router.Healthy],
// [Router.Unhealthy] and [Router.LeaseKey] read atomics and values set by
// [New] only, from any goroutine. A level stream's sync helper (sync.go)
// runs a [tailSync] of its own, built on the session goroutine, and the
// progress ticker only nudges the session goroutine: neither calls the
// Router. Shared between goroutines, each guarded by its own lock: the
// merge cache (the session goroutine, the confirmer, the sync helpers'
// re-index, and the level owners' Forget) and the pipeline's [retryQueue]
// (the session goroutine and the confirmer).
type Router struct {
	cfg    Config
	deps   routerDeps
	logger *slog.Logger

	classifier classifier
	writers    levelWriters // every level stream written (built by New, never changed)
	merges     *mergeCache  // lock-guarded, shared with the confirmer, the sync helpers and the level owners
	pipe       *writePipeline

	stats  routerCounters
	health routerHealth
	share  ingressShare
	run    runState
	hooks  testHooks
}

// routerDeps groups what a router shares with the rest of delayd: its
// JetStream context and its [Wiring]. Set by New, never written after.
type routerDeps struct {
	js jetstream.JetStream
	Wiring
}

// routerCounters groups the router's counters, read by [Router.Stats]
// from any goroutine. Writers: the confirmer's reports (routed, deadLettered)
// and the goroutine that runs the router (the rest, and deadLettered for
// the dead letters it writes itself; owner and epoch in [Router.RunTerm]).
type routerCounters struct {
	routed, deadLettered, clamped, skipped, merged atomic.Uint64
	// fencedIngress counts the terms that found a newer term's ingress
	// consumer (resetConsumers), in FencedWrites under DELAYD_INGRESS.
	fencedIngress atomic.Uint64

	// owner and epoch mirror runState.term for Stats: whether a term
	// runs now, and the epoch of the last one.
	owner atomic.Bool
	epoch atomic.Uint64
}

// routerHealth groups the router's own failure clock and the origin of
// every failure clock it has (its level writers' too); see Healthy. epoch
// is set by New; failing is written by Run's goroutine and the confirmer
// (failClock is atomic), read by Healthy from any goroutine.
type routerHealth struct {
	failing failClock // sessions or dead letters of placed messages failing; see Healthy
	epoch   time.Time // the failure clocks' origin (monotonic reading)
}

// ingressShare groups which share of the ingress the router routes. Set
// by New, never written after.
type ingressShare struct {
	// part is the ingress partition routed, parts the ingress partition
	// count; refusal prefixes this router's keys in message.Refusals.
	part, parts int
	refusal     string
}

// runState groups what the goroutine that runs the router ([Router.Run],
// [Router.RunTerm]) sets up per term and per session, and only it writes.
type runState struct {
	// term is the router lease's term the router runs in
	// ([Router.RunTerm]); the zero Term, always held, for a router on its
	// own. Run's goroutine only. stats.owner and stats.epoch mirror it for
	// Stats.
	term ownership.Term
	sync levelSync           // the level streams' tail syncs and held messages (sync.go)
	ids  *jswire.BatchReader // the id reader: id index lookups (Run's goroutine)

	// Per session.
	acks      *jswire.PubAcks // the session's level and dead-letter writes' PubAcks
	ingressID string          // unique to the ingress stream's life: its creation time
}

// testHooks groups the router's settings for tests, set before
// [Router.Run] (New sets ackTimeout's default).
type testHooks struct {
	ackTimeout time.Duration        // a write without its PubAck this long fails (and is retried)
	loseAcks   func(n uint64) bool  // tests: the session's n-th write's PubAck is dropped (jswire.PubAcks.LoseReplies)
	loseAnswer func(op string) bool // tests: a request about the ingress consumers ("list", "delete", "create") is applied but its answer dropped (ingressRequest)
	loseIndex  func() bool          // tests: a copy of an index write is stored but its PubAck lost (index.Group.LoseAnswers)
}

// levelWriter is the router's view of one level stream.
type levelWriter struct {
	level   levels.Level
	stream  string
	subject string // "delayd.level.<NAME>." + target

	marker string // its epoch marker's subject, "delayd.level.<NAME>.delayd.router.epoch"

	expected      uint64        // the stream's last sequence before the next write (Run's goroutine)
	lastSubmitted uint64        // highest ingress sequence written, confirmed or not (Run's goroutine)
	lastRouted    atomic.Uint64 // highest ingress sequence confirmed in the stream
	failing       failClock     // its writes failing since; reset only by a confirmed write (the session goroutine, the confirmer, its sync helper)

	// tailRef is the Delayd-Ingress of the stream's last router write as
	// the last tail sync found it ("" if none), which the epoch marker
	// carries; marked is the epoch whose marker the stream holds (Run's
	// goroutine). fenced counts the terms a newer router's writes to this
	// stream ended.
	tailRef string
	marked  uint64
	fenced  atomic.Uint64

	// ready: this session synced the stream's tail and it holds this
	// term's marker, so the router may write it; held are its ingress
	// messages waiting for that, in ingress order (Run's goroutine).
	ready bool
	held  []heldMsg
}

// levelWriters are the router's level writers, built by New and never
// changed after (each levelWriter's own fields say who writes them).
type levelWriters struct {
	all      []*levelWriter   // every level stream written: each level's partitions in order
	byNumber [][]*levelWriter // by level number (0 = immediate): the level's partitions, one if unpartitioned
}

// failClock holds when failures began without progress since, on the
// monotonic clock: nanoseconds since the router's epoch, plus one; 0 when
// healthy. Only progress resets it, never a retry.
type failClock struct{ since atomic.Int64 }

func (c *failClock) fail(epoch time.Time) { c.since.CompareAndSwap(0, int64(time.Since(epoch))+1) }

func (c *failClock) progress() { c.since.Store(0) }

// failingFor returns how long it has been failing; 0 if healthy.
func (c *failClock) failingFor(epoch time.Time) time.Duration {
	since := c.since.Load()
	if since == 0 {
		return 0
	}
	return time.Since(epoch) - time.Duration(since-1)
}

// NewStandalone returns a router on its own, outside a deliver.Service, for example
// to measure routing alone. The streams must exist; see deliver.Service. Such a
// router trusts no hop (its hop key is its own, random, so a message
// carrying Delayd-Origin is routed as a new message), merges nothing (no
// scanner can say a merge key's message is pending), re-indexes every
// candidate at start, and counts dead letters only in [Router.Stats]. A
// deliver.Service builds its router with its hop key and scanners. tails,
// if not nil, is told what the level streams hold ([Wiring].Tails).
func NewStandalone(js jetstream.JetStream, cfg Config, tails Tails) (*Router, error) {
	key := make(hop.Key, hop.KeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return New(js, cfg, Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key, Tails: tails})
}

// New returns a router wired to the rest of delayd.
func New(js jetstream.JetStream, cfg Config, wiring Wiring) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := wiring.validate(); err != nil {
		return nil, err
	}
	if wiring.Tails == nil {
		wiring.Tails = noTails{}
	}
	merges := newMergeCache()
	if wiring.Merges != nil {
		var err error
		if merges, err = wiring.Merges.of(cfg.IngressPartition); err != nil {
			return nil, err
		}
	}
	r := &Router{
		cfg: cfg, deps: routerDeps{js: js, Wiring: wiring}, logger: cfg.Logger,
		classifier: classifier{prefix: cfg.Prefix, levels: cfg.Levels, targets: cfg.Targets, maxDelay: cfg.MaxDelay},
		merges:     merges,
		hooks:      testHooks{ackTimeout: jswire.WriteAttempt},
		health:     routerHealth{epoch: time.Now()},
		share:      ingressShare{part: cfg.IngressPartition, parts: cfg.Partitions.Ingress(), refusal: message.RouterRefusal},
	}
	if r.share.parts > 1 {
		r.share.refusal = message.RouterRefusal + strconv.Itoa(r.share.part) + ":"
	}
	r.pipe = newWritePipeline(js, cfg.Logger, r, cfg.MaxInFlight)
	all := append([]levels.Level{{}}, cfg.Levels.Levels()...)
	all = append(all, cfg.Levels.PrecisionLevels()...)
	if err := cfg.Partitions.Check(cfg.Levels); err != nil {
		return nil, fmt.Errorf("deliver: router: %w", err)
	}
	for _, l := range all {
		var parts []*levelWriter
		for j, stream := range cfg.Partitions.Streams(l.Delay) {
			if cfg.Partitions.Router(j) != r.share.part {
				continue // another ingress partition's router writes it
			}
			name := strings.TrimPrefix(stream, levels.StreamPrefix)
			w := &levelWriter{level: l, stream: stream, subject: contract.LevelSubjectPrefix + name + ".", marker: markerSubject(name)}
			r.writers.all = append(r.writers.all, w)
			parts = append(parts, w)
		}
		r.writers.byNumber = append(r.writers.byNumber, parts)
	}
	return r, nil
}

// SetTailHook sets a test hook, called before each tail read of a level
// stream with its name; its error fails the read (a Service's tests, as
// deliver's tailHook). Call it before [Router.Run].
func (r *Router) SetTailHook(hook func(stream string) error) { r.run.sync.hook = hook }

// Healthy reports whether the router has made progress within
// [StallAfterDefault] of its first failure: a level write confirmed,
// or nothing left to route. Retries, session restarts and reconnects are not
// progress.
func (r *Router) Healthy() bool { return r.Unhealthy() == "" }

// Unhealthy returns why the router is not healthy, naming the level stream
// whose writes keep failing; "" if it is healthy.
func (r *Router) Unhealthy() string {
	if d := r.health.failing.failingFor(r.health.epoch); d > StallAfterDefault {
		return fmt.Sprintf("router failing for %s", d.Round(time.Second))
	}
	for _, w := range r.writers.all {
		if d := w.failing.failingFor(r.health.epoch); d > StallAfterDefault {
			return fmt.Sprintf("router: writes to level stream %s failing for %s", w.stream, d.Round(time.Second))
		}
	}
	return ""
}

// progress records that the router is caught up or confirmed writes of
// every kind: no failure clock runs.
func (r *Router) progress() {
	r.health.failing.progress()
	for _, w := range r.writers.all {
		w.failing.progress()
	}
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	st := Stats{
		Routed: r.stats.routed.Load(), DeadLettered: r.stats.deadLettered.Load(), Clamped: r.stats.clamped.Load(), Skipped: r.stats.skipped.Load(),
		Merged: r.stats.merged.Load(), IndexErrors: r.pipe.indexErrors.Load(),
		Owner: r.stats.owner.Load(), Epoch: r.stats.epoch.Load(),
		IngressPartition: r.share.part, Lease: r.LeaseKey(),
	}
	count := func(stream string, n uint64) {
		if n > 0 {
			if st.FencedWrites == nil {
				st.FencedWrites = make(map[string]uint64)
			}
			st.FencedWrites[stream] = n
		}
	}
	for _, w := range r.writers.all {
		count(w.stream, w.fenced.Load())
	}
	count(resource.IngressStream, r.stats.fencedIngress.Load())
	return st
}
