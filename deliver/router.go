package deliver

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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
)

// Router defaults.
const (
	// RouterMaxInFlightDefault bounds level-stream writes awaiting their PubAck.
	RouterMaxInFlightDefault = 4096
	// RouterBatchDefault is how many ingress messages are pulled ahead.
	RouterBatchDefault = 1024
	// RouterConsumer is the durable name of the ingress consumer of a
	// router on its own ([NewRouter]), and the prefix of a [Service]'s,
	// which is per term of the router lease: "delayd-router-<epoch>"
	// ([RouterConsumerName]). Earlier versions used it unsuffixed; a new
	// term deletes that one too.
	RouterConsumer = "delayd-router"

	ingressAckWait = 30 * time.Second
)

// Dead-letter reasons: the last token of the dead-letter subject
// "delayd.dlq.<reason>". The set is closed so it can label metrics.
const (
	ReasonLevel         = "level"         // bad Delay-Level
	ReasonTarget        = "target"        // invalid or forbidden target subject
	ReasonSize          = "size"          // too large once delayd's headers are added
	ReasonUndeliverable = "undeliverable" // a target refused it permanently
)

// RouterConfig configures a [Router].
type RouterConfig struct {
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
	// [RouterMaxInFlightDefault].
	MaxInFlight int

	// Batch is how many ingress messages are pulled ahead. Optional. Default
	// [RouterBatchDefault].
	Batch int

	// OnRouted is called with a level stream's name and a sequence it now
	// holds, for observers such as metrics: after each confirmed level
	// write, with the sequence the write got, and after each tail sync (at
	// the start of a session and before a retry), with the stream's last
	// sequence. (Scanners need no nudge: their pending pull request
	// receives the message.) Calls come from one goroutine, the router's
	// acker, one at a time, in ingress order; it must not block, as the
	// acker acks nothing meanwhile. Optional.
	OnRouted func(stream string, seq uint64)
}

func (c *RouterConfig) setDefaults() {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = RouterMaxInFlightDefault
	}
	if c.Batch == 0 {
		c.Batch = RouterBatchDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = contract.MaxDelayDefault
	}
	if c.OnRouted == nil {
		c.OnRouted = func(string, uint64) {}
	}
}

func (c *RouterConfig) validate() error {
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

// routerWiring is what a router shares with the rest of delayd. A
// [Service] fills it from its own state; [NewRouter] fills it for a router
// on its own.
type routerWiring struct {
	// reasons counts dead letters by reason, shared with the scanners.
	// Required.
	reasons *reasonCounts

	// refused tracks the dead letters DELAYD_DLQ refused, shared with the
	// scanners. Required.
	refused *dlqRefusals

	// hopKey authenticates hops: only a message whose hop MAC it verifies
	// keeps its first id, enqueue time and hop count. Required.
	hopKey hopKey

	// scanners is the router's view of the level scanners. Optional: nil
	// merges nothing (no scanner can say a message is pending) and
	// re-indexes every candidate at start.
	scanners levelScanners

	// lookupConn reads the id index for merge checks ([Config].LookupConn:
	// the server walks the index inline on the reading connection).
	// Optional: nil reads on the router's own connection.
	lookupConn *nats.Conn
}

func (w *routerWiring) validate() error {
	switch {
	case w.reasons == nil:
		return errors.New("deliver: router: dead-letter reason counts are required")
	case w.refused == nil:
		return errors.New("deliver: router: dead-letter refusals are required")
	case len(w.hopKey) == 0:
		return errors.New("deliver: router: a hop key is required")
	}
	return nil
}

// levelScanners is what the router asks of the level streams' scanners.
type levelScanners interface {
	// pendingAt reports whether the level message rec places has not been
	// handed to its target yet and is not cancelled; rec's hop and due
	// come from its index record. Merging asks it.
	pendingAt(ctx context.Context, rec index.Record) bool

	// passed returns the highest sequence stream's scanner handed off.
	passed(ctx context.Context, stream string) uint64

	// committed returns stream's committed offset, 0 if unknown, for the
	// re-index at start.
	committed(ctx context.Context, stream string) uint64
}

// RouterStats are the router's counters since start.
type RouterStats struct {
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
	// ended; and under [IngressStream], those that found a newer term's
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
// them in order on its acker goroutine; the merge cache (mergecache.go)
// remembers merge keys' placements under its own lock. The rest runs on
// the goroutine that calls [Router.Run].
type Router struct {
	js     jetstream.JetStream
	cfg    RouterConfig
	wiring routerWiring
	logger *slog.Logger

	classifier classifier
	pipe       *writePipeline
	acks       *jswire.PubAcks     // the session's level and dead-letter writes' PubAcks
	ackTimeout time.Duration       // a write without its PubAck this long fails (and is retried)
	loseAcks   func(n uint64) bool // tests: the session's n-th write's PubAck is dropped (jswire.PubAcks.LoseReplies)
	merges     *mergeCache

	ingressID string           // unique to the ingress stream's life: its creation time
	writers   []*levelWriter   // every level stream written: each level's partitions in order
	byLevel   [][]*levelWriter // by level index (0 = immediate): the level's partitions, one if unpartitioned

	failing failClock // sessions or dead letters of placed messages failing; see Healthy
	epoch   time.Time // the failure clocks' origin (monotonic reading)

	tails *jswire.BatchReader // level streams' tails (Run's goroutine)
	index *jswire.BatchReader // index lookups (Run's goroutine)

	routed, deadLettered, clamped, skipped, merged atomic.Uint64
	// fencedIngress counts the terms that found a newer term's ingress
	// consumer (resetConsumers), in FencedWrites under [IngressStream].
	fencedIngress atomic.Uint64

	// part is the ingress partition routed, parts the ingress partition
	// count; refusal prefixes this router's keys in dlqRefusals.
	part, parts int
	refusal     string

	// term is the router lease's term the router runs in
	// ([Router.runTerm]); the zero Term, always held, for a router on its
	// own. Run's goroutine only. owned and epoch mirror it for Stats.
	term      leadership.Term
	owned     atomic.Bool
	termEpoch atomic.Uint64
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
	failing       failClock     // its writes failing since; reset only by a confirmed write

	// tailRef is the Delayd-Ingress of the stream's last router write as
	// the last tail sync found it ("" if none), which the epoch marker
	// carries; marked is the epoch whose marker the stream holds (Run's
	// goroutine). fenced counts the terms a newer router's writes to this
	// stream ended.
	tailRef string
	marked  uint64
	fenced  atomic.Uint64
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

// routing is one ingress message on its way. The ingress message itself is
// never changed: its level message and its dead letter are built afresh.
type routing struct {
	msg    *nats.Msg    // the ingress message; Reply is its $JS.ACK subject
	seq    uint64       // ingress sequence
	w      *levelWriter // nil for a dead letter
	out    *nats.Msg    // the level message or the dead letter
	fut    *jswire.PubAckFuture
	err    error
	reason error // why it is a dead letter

	// invalid: it goes to no level stream, only to DELAYD_DLQ, so routing
	// may pass it while its dead letter is refused (see deferDeadLetter).
	invalid bool

	index  [2]index.Record // the placement's records: by id, and by merge key if any
	nIndex int
}

func (rt *routing) ack() { _ = rt.msg.Respond(jswire.AckAck) }

func (rt *routing) inProgress() { _ = rt.msg.Respond(jswire.AckProgress) }

// NewRouter returns a router on its own, outside a [Service], for example
// to measure routing alone. The streams must exist; see [Service]. Such a
// router trusts no hop (its hop key is its own, random, so a message
// carrying Delayd-Origin is routed as a new message), merges nothing (no
// scanner can say a merge key's message is pending), re-indexes every
// candidate at start, and counts dead letters only in [Router.Stats]. A
// [Service] builds its router with its hop key and scanners.
func NewRouter(js jetstream.JetStream, cfg RouterConfig) (*Router, error) {
	key := make(hopKey, hopKeySize)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return newRouter(js, cfg, routerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: key})
}

// newRouter returns a router wired to the rest of delayd.
func newRouter(js jetstream.JetStream, cfg RouterConfig, wiring routerWiring) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := wiring.validate(); err != nil {
		return nil, err
	}
	r := &Router{
		js: js, cfg: cfg, wiring: wiring, logger: cfg.Logger,
		classifier: classifier{prefix: cfg.Prefix, levels: cfg.Levels, targets: cfg.Targets, maxDelay: cfg.MaxDelay},
		merges:     newMergeCache(),
		ackTimeout: publishAsyncTimeout,
		epoch:      time.Now(),
		part:       cfg.IngressPartition, parts: cfg.Partitions.Ingress(), refusal: routerRefusal,
	}
	if r.parts > 1 {
		r.refusal = routerRefusal + strconv.Itoa(r.part) + ":"
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
			if cfg.Partitions.Router(j) != r.part {
				continue // another ingress partition's router writes it
			}
			name := strings.TrimPrefix(stream, levels.StreamPrefix)
			w := &levelWriter{level: l, stream: stream, subject: levelSubjects + name + ".", marker: markerSubject(name)}
			r.writers = append(r.writers, w)
			parts = append(parts, w)
		}
		r.byLevel = append(r.byLevel, parts)
	}
	return r, nil
}

// Healthy reports whether the router has made progress within
// [ScannerStallAfterDefault] of its first failure: a level write confirmed,
// or nothing left to route. Retries, session restarts and reconnects are not
// progress.
func (r *Router) Healthy() bool { return r.Unhealthy() == "" }

// Unhealthy returns why the router is not healthy, naming the level stream
// whose writes keep failing; "" if it is healthy.
func (r *Router) Unhealthy() string {
	if d := r.failing.failingFor(r.epoch); d > ScannerStallAfterDefault {
		return fmt.Sprintf("router failing for %s", d.Round(time.Second))
	}
	for _, w := range r.writers {
		if d := w.failing.failingFor(r.epoch); d > ScannerStallAfterDefault {
			return fmt.Sprintf("router: writes to level stream %s failing for %s", w.stream, d.Round(time.Second))
		}
	}
	return ""
}

// progress records that the router is caught up or confirmed writes of
// every kind: no failure clock runs.
func (r *Router) progress() {
	r.failing.progress()
	for _, w := range r.writers {
		w.failing.progress()
	}
}

// Stats returns the router's counters.
func (r *Router) Stats() RouterStats {
	st := RouterStats{
		Routed: r.routed.Load(), DeadLettered: r.deadLettered.Load(), Clamped: r.clamped.Load(), Skipped: r.skipped.Load(),
		Merged: r.merged.Load(), IndexErrors: r.pipe.indexErrors.Load(),
		Owner: r.owned.Load(), Epoch: r.termEpoch.Load(),
		IngressPartition: r.part, Lease: r.LeaseKey(),
	}
	count := func(stream string, n uint64) {
		if n > 0 {
			if st.FencedWrites == nil {
				st.FencedWrites = make(map[string]uint64)
			}
			st.FencedWrites[stream] = n
		}
	}
	for _, w := range r.writers {
		count(w.stream, w.fenced.Load())
	}
	count(IngressStream, r.fencedIngress.Load())
	return st
}

// runTerm routes for one term of the router lease: until ctx is done (a
// stop, or the term's end) or the router finds its term no longer valid.
// In-flight writes settle on the way out, as in [Router.Run]; the elector
// releases the lease after it returns. The merge cache starts empty: what
// it knew may have changed under another replica's router.
func (r *Router) runTerm(ctx context.Context, t leadership.Term) error {
	r.term = t
	r.termEpoch.Store(t.Epoch)
	r.owned.Store(true)
	r.merges.reset()
	for _, w := range r.writers {
		w.marked = 0 // each term writes its own marker
	}
	// Writes an earlier term left failed are not retried: their ingress
	// messages are unacked, and this term's consumer delivers them again.
	r.pipe.takeFailed()
	defer func() {
		r.owned.Store(false)
		r.progress() // not routing is not failing: no failure clock runs
	}()
	return r.Run(ctx)
}

// Run routes until ctx is done, then lets in-flight writes finish (or
// abandons them: their ingress messages stay unacked and are routed again,
// without duplicates, on the next start) and returns nil. It survives server
// restarts and reconnects; it returns an error only for a bad setup.
func (r *Router) Run(ctx context.Context) error {
	tails, err := jswire.NewBatchReader(r.js.Conn(), tailBatch)
	if err != nil {
		return err
	}
	defer tails.Close()
	r.tails = tails
	lookups, err := jswire.NewBatchReader(cmp.Or(r.wiring.lookupConn, r.js.Conn()), index.Batch)
	if err != nil {
		return err
	}
	defer lookups.Close()
	r.index = lookups
	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		began := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRouterFenced) {
			// Once per term: the session acked nothing after the
			// refused write, and the term ends here.
			r.logger.Warn("router stopped: a router of a newer term writes the level streams (fenced)", slog.Uint64("epoch", r.term.Epoch), slog.Any("error", err))
			return nil
		}
		if !r.term.Held() {
			r.logger.Info("router stopped: this replica's lease term ended", slog.Uint64("epoch", r.term.Epoch), slog.Any("error", err))
			return nil
		}
		r.failing.fail(r.epoch)
		if time.Since(began) > time.Minute {
			backoff.reset() // a long healthy session: start the backoff afresh
		}
		r.logger.Warn("router restarting", slog.Any("error", err))
		if !backoff.sleep(ctx) {
			return nil
		}
	}
}

// session runs one ingress consumer from a fresh resync until an error.
func (r *Router) session(ctx context.Context) error {
	if !r.term.Held() {
		return errNotOwner // a stale router recreates no stream and writes no index record
	}
	info, err := r.js.Stream(ctx, IngressStream)
	if err != nil {
		return fmt.Errorf("ingress stream: %w", err)
	}
	r.ingressID = strconv.FormatInt(info.CachedInfo().Created.UnixNano(), 10)
	// The acker runs for the session; stopping it lets every write sent
	// settle (flushing the open index group first), before the PubAck
	// tracker closes.
	acks, err := jswire.NewPubAcks(r.js.Conn(), r.ackTimeout)
	if err != nil {
		return err
	}
	if r.loseAcks != nil {
		acks.LoseReplies(r.loseAcks)
	}
	r.acks = acks
	defer acks.Close()
	r.pipe.start()
	defer r.pipe.stop()
	if err := r.syncTails(ctx); err != nil {
		return err
	}
	if err := r.reindex(ctx, info.CachedInfo().State); err != nil {
		return err
	}
	// Phase 1 of the router's ownership: one router at a time, by lease;
	// it stops at its term's end and checks its term before every level
	// write. A stale router paused between that check and its write (or
	// with writes in flight) could still write: so before its first
	// write, a new term's router writes its epoch marker to every level
	// stream at the synced tail (markLevels), and a stale router's write
	// expecting an older last sequence fails; its resync then finds the
	// newer marker and stops it (syncTail). The ingress consumer is per
	// term too, so a stale router can neither delete the new router's
	// consumer nor ack into it.
	if !r.term.Held() {
		return errNotOwner
	}
	if err := r.markLevels(ctx); err != nil {
		return err
	}
	consumer, err := r.resetConsumers(ctx, info)
	if err != nil {
		return err
	}
	var filter string
	if r.parts > 1 {
		filter = ingressPartitionSubject(r.part) + ">"
	}
	_, err = r.js.CreateOrUpdateConsumer(ctx, IngressStream, jetstream.ConsumerConfig{
		Durable:       consumer,
		FilterSubject: filter,
		Description:   "delayd router: ingress to level streams",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ingressAckWait,
		MaxAckPending: r.cfg.MaxInFlight + 2*r.cfg.Batch,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("create ingress consumer: %w", err)
	}
	pull, err := jswire.NewPull(r.js.Conn(), IngressStream, consumer, r.cfg.Batch, 0)
	if err != nil {
		return err
	}
	// The fresh consumer redelivers every unacked message: dead letters
	// still refused are recorded again when they are.
	r.wiring.refused.forget(r.refusal)
	stop := context.AfterFunc(ctx, pull.Stop)
	defer stop()
	defer pull.Stop()

	// The consumer is fresh: its deliveries are numbered from 1, one more
	// for each (a redelivery too). A number skipped is a delivery lost on
	// the way (a connection cut while a pull's messages were in flight):
	// the consumer takes that message as delivered and would redeliver it
	// only after the ack wait, behind later messages of its level, and by
	// then the tail check would take it for one already written. So the
	// session ends at the first gap, before anything behind it is
	// routed; the next session's fresh consumer redelivers it at once, in
	// order.
	nextDelivery := uint64(1)
	for {
		if r.pipe.broken.Load() {
			if err := r.retryFailed(ctx); err != nil {
				return err
			}
		}
		m, err := pull.Next(ctx, r.pipe.kick, false, 0)
		if m == nil && err == nil {
			// Nothing waiting. Nothing in flight and nothing failed:
			// caught up, which is progress.
			if r.pipe.idle() {
				r.progress()
			}
			m, err = pull.Next(ctx, r.pipe.kick, true, 0)
		}
		if errors.Is(err, jswire.ErrWoken) {
			continue // a write failed: retry before the next message
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("ingress: %w", err)
		}
		meta, ok := jswire.ParseAck(m.Reply)
		if !ok {
			r.logger.Error("ingress message with an unreadable ack subject", slog.String("reply", m.Reply))
			_ = m.Respond(jswire.AckTerm)
			continue
		}
		if meta.ConsumerSeq > nextDelivery {
			return fmt.Errorf("%w: ingress deliveries %d to %d did not arrive (a connection cut?); a fresh consumer redelivers them in order",
				errDeliveryLost, nextDelivery, meta.ConsumerSeq-1)
		}
		nextDelivery = max(nextDelivery, meta.ConsumerSeq+1)
		if !r.term.Held() {
			// Checked before each message's level write (a mutex and a
			// monotonic clock read): m stays unacked, for the next owner.
			return errNotOwner
		}
		if r.parts > 1 {
			// Stored as "delayd.in.<i>.<target>": routed, indexed and
			// dead-lettered under the subject it was published to.
			if rest, ok := strings.CutPrefix(m.Subject, ingressPartitionSubject(r.part)); ok {
				m.Subject = r.cfg.Prefix + "." + rest
			}
		}
		r.route(ctx, m, meta)
	}
}

// errDeliveryLost ends a router session whose ingress consumer skipped a
// delivery number.
var errDeliveryLost = errors.New("ingress delivery lost")

// RouterConsumerName returns the durable name of the router's ingress
// consumer in a term of epoch: "delayd-router-<epoch>", or [RouterConsumer]
// for epoch 0 (a router on its own, without a lease).
func RouterConsumerName(epoch uint64) string {
	if epoch == 0 {
		return RouterConsumer
	}
	return RouterConsumer + "-" + strconv.FormatUint(epoch, 10)
}

// routerConsumerEpoch returns the epoch in a router consumer's name: 0 for
// [RouterConsumer] itself; false for a name that is not a router's.
func routerConsumerEpoch(name string) (uint64, bool) {
	if name == RouterConsumer {
		return 0, true
	}
	rest, ok := strings.CutPrefix(name, RouterConsumer+"-")
	if !ok {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil
}

// LeaseKey returns the key of the router's lease: "router", or
// "router.<ingress partition>" when ingress is partitioned.
func (r *Router) LeaseKey() string {
	if r.parts > 1 {
		return leadership.RouterPartitionKey(r.part)
	}
	return leadership.RouterKey
}

// consumerName returns the durable name of the router's ingress consumer
// in a term of epoch: [RouterConsumerName] when ingress is not
// partitioned, else "delayd-router-p<ingress partition>-<epoch>".
func (r *Router) consumerName(epoch uint64) string {
	if r.parts > 1 {
		return RouterConsumer + "-p" + strconv.Itoa(r.part) + "-" + strconv.FormatUint(epoch, 10)
	}
	return RouterConsumerName(epoch)
}

// consumerEpoch returns the epoch in the name of one of this router's
// ingress consumers (of its ingress partition); false for any other name.
func (r *Router) consumerEpoch(name string) (uint64, bool) {
	if r.parts < 2 {
		return routerConsumerEpoch(name)
	}
	rest, ok := strings.CutPrefix(name, RouterConsumer+"-p"+strconv.Itoa(r.part)+"-")
	if !ok {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil
}

// resetConsumers deletes this term's ingress consumer if an earlier session
// left it (a fresh consumer redelivers every unacked ingress message at
// once, instead of after the ack wait) and every router consumer of an
// older term, and returns this term's consumer name. They go before the
// new one is created: the ingress stream is a work queue, which takes one
// unfiltered consumer at a time. A consumer of a newer term means a newer
// router runs: this one is fenced. (So a stale router can never delete the
// consumer of a newer term, nor create its own beside it.)
func (r *Router) resetConsumers(ctx context.Context, ingress jetstream.Stream) (string, error) {
	mine := r.consumerName(r.term.Epoch)
	lctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	names := ingress.ConsumerNames(lctx)
	var old []string
	for name := range names.Name() {
		e, ok := r.consumerEpoch(name)
		switch {
		case !ok:
		case e > r.term.Epoch && r.term.Epoch > 0:
			r.fencedIngress.Add(1)
			return "", fmt.Errorf("%w: the ingress consumer %s of term %d exists, this router's term is %d", errRouterFenced, name, e, r.term.Epoch)
		case name == mine || (e < r.term.Epoch && r.term.Epoch > 0):
			old = append(old, name)
		}
	}
	if err := names.Err(); err != nil {
		return "", fmt.Errorf("list ingress consumers: %w", err)
	}
	for _, name := range old {
		if err := r.js.DeleteConsumer(ctx, IngressStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return "", fmt.Errorf("reset ingress consumer %s: %w", name, err)
		}
		if name != mine {
			r.logger.Info("deleted the ingress consumer of an earlier router term", slog.String("consumer", name))
		}
	}
	return mine, nil
}

// syncTails syncs every level writer and reports each stream's last
// sequence (OnRouted): a write whose PubAck was lost is found here, not
// acked.
func (r *Router) syncTails(ctx context.Context) error {
	for _, w := range r.writers {
		if err := r.syncTail(ctx, w); err != nil {
			return err
		}
		if w.expected > 0 {
			r.pipe.reportTail(w.stream, w.expected)
		}
	}
	return nil
}

// syncTail reads a level stream's last sequence and the ingress sequence of
// its last message.
func (r *Router) syncTail(ctx context.Context, w *levelWriter) error {
	s, err := r.js.Stream(ctx, w.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted while delayd ran: without it no level could be routed.
		r.logger.Warn("level stream missing; recreating it", slog.String("stream", w.stream))
		if err = ensureLevelStream(ctx, r.js, w.stream, w.level.Delay, max(r.cfg.Replicas, 1)); err == nil {
			s, err = r.js.Stream(ctx, w.stream)
		}
	}
	if err != nil {
		return fmt.Errorf("level stream %s: %w", w.stream, err)
	}
	st := s.CachedInfo().State
	last := st.LastSeq
	w.expected = last
	w.lastRouted.Store(0)
	w.tailRef = ""
	if last > 0 {
		// The newest epoch marker first: a newer router's fences this one
		// before anything it wrote is taken for this router's.
		if err := r.checkMarker(ctx, w); err != nil {
			return err
		}
		ref, seq, err := r.lastIngressRef(ctx, w.stream, st)
		if err != nil {
			return err
		}
		w.tailRef = ref
		w.lastRouted.Store(seq)
	}
	w.lastSubmitted = w.lastRouted.Load()
	return nil
}

// Tail sync reads back at most tailWalkBack messages of a level stream,
// tailBatch at a time, for the last one the router wrote.
const (
	tailBatch    = 16
	tailWalkBack = 256
)

// lastIngressRef returns the ingress reference (Delayd-Ingress) of the last
// message of a level stream (state st) that a router wrote, and its
// ingress sequence if it was written for this ingress stream's life (else
// 0); "" and 0 when there is none. An epoch marker carries the reference
// of the last router write before it (Delayd-Router-Tail), as its writer
// synced it, or none: the walk ends at the newest marker, as at a router
// write. A last message without a valid reference that is no marker was
// not written by delayd (something else published to the level subject):
// the router walks back over it, up to tailWalkBack messages, to its own
// last write, and logs it. Found nowhere, ingress messages not yet acked
// may be written to the level stream again, and that is logged too.
func (r *Router) lastIngressRef(ctx context.Context, stream string, st jetstream.StreamState) (string, uint64, error) {
	var buf []*nats.Msg
	foreign := false // walked back over a message delayd did not write
	first := max(st.FirstSeq, 1)
	for to := st.LastSeq; to >= first && st.LastSeq-to < tailWalkBack; {
		from := first
		if to-first >= tailBatch {
			from = to - tailBatch + 1
		}
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		var err error
		buf, err = r.tails.Read(rctx, stream, buf[:0], from, int(to-from+1), 1<<20)
		cancel()
		if err != nil {
			return "", 0, fmt.Errorf("level stream %s tail: %w", stream, err)
		}
		if to == st.LastSeq && (len(buf) == 0 || buf[len(buf)-1].Header.Get(hdrJSSequence) != strconv.FormatUint(st.LastSeq, 10)) {
			r.logger.Warn("level stream tail missing; redelivered ingress messages may be written twice", slog.String("stream", stream))
			return "", 0, nil
		}
		for i := len(buf) - 1; i >= 0; i-- {
			m := buf[i]
			seq, _ := strconv.ParseUint(m.Header.Get(hdrJSSequence), 10, 64)
			if seq > to {
				continue // past this read's range (a byte-limited read returns fewer)
			}
			ref, marker := m.Header.Get(hdrIngress), isMarkerMsg(m)
			if marker {
				ref = m.Header.Get(hdrRouterTail)
			}
			id, ingressSeq, ok := parseIngressRef(ref)
			if ok || marker {
				if foreign {
					r.logger.Warn("level stream's last messages have no valid ingress reference (not written by delayd); synced to the last one that has",
						slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("synced_seq", seq))
				}
				if !ok {
					return "", 0, nil // a marker: no router write before it
				}
				if id != r.ingressID {
					return ref, 0, nil // written for an earlier ingress stream
				}
				return ref, ingressSeq, nil
			}
			foreign = true
		}
		if len(buf) == 0 {
			break
		}
		lowest, _ := strconv.ParseUint(buf[0].Header.Get(hdrJSSequence), 10, 64)
		if lowest <= first {
			break
		}
		to = lowest - 1
	}
	r.logger.Warn("no message at the end of the level stream has a valid ingress reference; redelivered ingress messages may be written twice",
		slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Int("read_back", tailWalkBack))
	return "", 0, nil
}

// reindex writes the index records of level messages whose ingress message
// is not acked yet. Their records may have been lost: a crash between the
// level write and the index write. Only ingress messages not acked can be
// such, and only the last MaxAckPending of each level stream can hold them;
// messages the level's committed offset has passed are left alone (a
// cancelled one's "cancelled" record must stay the latest).
func (r *Router) reindex(ctx context.Context, ingress jetstream.StreamState) error {
	if ingress.Msgs == 0 {
		return nil
	}
	window := uint64(r.cfg.MaxInFlight + 2*r.cfg.Batch)
	g := index.NewGroup()
	n := 0
	var buf []*nats.Msg
	for _, w := range r.writers {
		if w.expected == 0 || w.lastRouted.Load() < ingress.FirstSeq {
			continue // the level's last message was acked at ingress
		}
		from := uint64(1)
		if w.expected > window {
			from = w.expected - window + 1
		}
		if r.wiring.scanners != nil {
			from = max(from, r.wiring.scanners.committed(ctx, w.stream)+1)
		}
		for from <= w.expected {
			rctx, cancel := context.WithTimeout(ctx, opTimeout)
			var err error
			buf, err = r.index.Read(rctx, w.stream, buf[:0], from, index.Batch, 1<<20)
			cancel()
			if err != nil {
				return fmt.Errorf("re-index %s: %w", w.stream, err)
			}
			if len(buf) == 0 {
				break
			}
			for _, m := range buf {
				seq, _ := strconv.ParseUint(m.Header.Get(hdrJSSequence), 10, 64)
				from = max(from, seq+1)
				_, ing, ok := parseIngressRef(m.Header.Get(hdrIngress))
				if !ok || isMarkerMsg(m) || ing < ingress.FirstSeq || seq > w.expected {
					continue
				}
				due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
				_, hop := m.Header[hdrHopDue]
				target := strings.TrimPrefix(m.Header.Get(hdrJSSubject), w.subject)
				if key := levelKey(m.Header); key != "" {
					g.Add(index.Record{Key: key, Stream: w.stream, Seq: seq, Hop: hop, Due: due, Target: target})
				}
				if mk := m.Header.Get(hdrMerge); mk != "" {
					rec := index.Record{Key: index.MergeKey(target, mk), Stream: w.stream, Seq: seq, Hop: hop, Due: due, Target: target}
					g.Add(rec)
					r.merges.remember(rec)
				}
				n++
			}
		}
	}
	if n == 0 {
		return nil
	}
	g.Flush(r.js)
	if err := g.Stored(); err != nil {
		return fmt.Errorf("re-index: %w", err)
	}
	r.logger.Info("re-indexed level messages whose ingress message was not acked", slog.Int("messages", n))
	return nil
}

// route classifies one ingress message (meta: its $JS.ACK metadata) and
// starts its write.
func (r *Router) route(ctx context.Context, m *nats.Msg, meta jswire.AckMeta) {
	rt := &routing{msg: m, seq: meta.StreamSeq}
	hop := checkHop(r.wiring.hopKey, m.Subject, m.Header)
	p, err := r.classifier.classify(m.Subject, m.Header, meta.Stored, hop)
	if p.Clamped {
		r.clamped.Add(1)
		r.logger.Warn("delay level above the table, clamped to the highest level",
			slog.String("value", strings.TrimSpace(headerFold(m.Header, contract.HeaderLevel))), slog.String("delay_level", p.Level.Name()), slog.String("subject", m.Subject))
	}
	if err != nil {
		rt.invalid = true
		r.deadLetter(rt, err)
		return
	}
	partKey := headerFold(m.Header, contract.HeaderPartitionKey)
	w := r.writerFor(p, partKey)
	if rt.seq <= w.lastRouted.Load() {
		r.skipped.Add(1)
		rt.ack()
		return
	}
	if rt.seq <= w.lastSubmitted {
		return // a redelivery of a write still in flight; its PubAck acks it
	}
	if p.Merge != "" && !p.Hop {
		merge, err := r.mergeInto(ctx, p.Target, p.Merge)
		if err != nil && ctx.Err() != nil {
			// Shutting down: left unacked, it is routed again by the
			// next session, merged or not as the index says then.
			return
		}
		if err != nil {
			r.logger.Warn("merge lookup failed; delivering the message on its own", slog.Any("error", err))
		}
		if merge {
			// Merged into the pending first message with this key and
			// target: its payload is dropped, the first is delivered at
			// its due time.
			r.merged.Add(1)
			rt.ack()
			return
		}
	}
	if hop == hopForged {
		// Not a hop made by delayd: a publisher's own Delayd-* headers.
		r.logger.Warn("message with delayd's hop headers but no valid hop MAC; routed as a new message", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq))
	}
	rt.w = w
	var due time.Time
	rt.out, due = levelMessage(m.Header, m.Data, p, w.subject, meta.Stored, r.ingressRef(rt.seq))
	if partKey != "" {
		rt.out.Header[hdrPartKey] = []string{partKey} // a hop keeps it (forward)
	}
	rt.setIndex(w.stream, p, due)
	r.submit(rt)
}

// writerFor returns the level writer of placement p: for a partitioned
// level, partition [levels.PartitionOf] of the partition key, key if it is
// not "" (a Delay-Partition-Key), else the target subject. One key thus
// always goes to one partition stream, which has one writer and is
// delivered in order: the key's order holds.
func (r *Router) writerFor(p placement, key string) *levelWriter {
	parts := r.byLevel[p.Level.Index]
	if len(parts) == 1 {
		return parts[0]
	}
	if key == "" {
		key = p.Target
	}
	return parts[levels.PartitionOf(key, len(parts))]
}

// headerFold returns the first value of header name in any case; "" if
// none.
func headerFold(h nats.Header, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// setIndex sets the index records of rt's placement in stream (its sequence
// is set when the write is sent): by id (the publisher's, else the first
// ingress sequence) and by merge key.
func (rt *routing) setIndex(stream string, p placement, due time.Time) {
	_, hops := rt.out.Header[hdrHopDue]
	rt.index[0] = index.Record{Key: levelKey(rt.out.Header), Stream: stream, Hop: hops, Due: due, Target: p.Target}
	rt.nIndex = 1
	if p.Merge != "" {
		rt.index[1] = index.Record{Key: index.MergeKey(p.Target, p.Merge), Stream: stream, Hop: hops, Due: due, Target: p.Target}
		rt.nIndex = 2
	}
}

// mergeInto reports whether a message with merge key key for target has a
// pending first message to be merged into: one written in this session and
// not yet confirmed, or one the index places in a level stream that has not
// handed it to its target yet. A lookup that fails merges nothing and
// returns its error: the message is then delivered on its own, never lost.
func (r *Router) mergeInto(ctx context.Context, target, key string) (bool, error) {
	if r.wiring.scanners == nil {
		return false, nil
	}
	k := index.MergeKey(target, key)
	rec, ok := r.merges.lookup(k)
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		var err error
		rec, ok, err = index.Lookup(ctx, r.index, k, opTimeout)
		if err == nil && ok && rec.Stream != "" && !rec.Gone {
			ok, err = r.placed(ctx, rec, target, key)
		}
		if err != nil {
			return false, err
		}
	}
	if !ok || rec.Stream == "" || rec.Gone {
		return false, nil
	}
	pending := r.wiring.scanners.pendingAt(ctx, rec)
	if err := ctx.Err(); err != nil {
		// Stopped while asking: no answer is not "not pending" here; the
		// message stays unacked for the next session (as a lookup stopped by
		// ctx leaves it).
		return false, err
	}
	return pending, nil
}

// placed reports whether an index record of merge key key for target names
// a stored placement: the message at its sequence has that key and target.
// A record can outlive a level write that failed (it was written in the
// same group as other records, then delayd crashed): its sequence is then
// empty, or holds another message. A message that already hopped on
// (purged from the level) counts as placed: its record is the latest, so it
// has not been placed again yet.
func (r *Router) placed(ctx context.Context, rec index.Record, target, key string) (bool, error) {
	msgs, err := r.index.Read(ctx, rec.Stream, nil, rec.Seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(msgs) == 0 || msgs[0].Header.Get(hdrJSSequence) != strconv.FormatUint(rec.Seq, 10) {
		if !rec.Hop || r.wiring.scanners == nil {
			return false, nil
		}
		passed := r.wiring.scanners.passed(ctx, rec.Stream)
		if err := ctx.Err(); err != nil {
			return false, err // stopped while asking (see mergeInto)
		}
		return rec.Seq <= passed, nil
	}
	prefix := levelSubjects + strings.TrimPrefix(rec.Stream, levels.StreamPrefix) + "."
	subject := msgs[0].Header.Get(hdrJSSubject)
	return msgs[0].Header.Get(hdrMerge) == key && strings.HasPrefix(subject, prefix) && subject[len(prefix):] == target, nil
}

// submit sends the level write of rt.
func (r *Router) submit(rt *routing) {
	w := rt.w
	rt.out.Header[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(w.expected, 10)}
	fut, err := r.acks.Publish(rt.out)
	if err != nil {
		rt.err = err
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused before it was sent: nothing to resync, order is kept.
			// A hop's earlier placement is still its latest index
			// record: record that it left delayd.
			r.writeIndex(rt, "", 0)
			r.deadLetter(rt, fmt.Errorf("%w: %d payload bytes plus delayd's headers exceed the server's max payload", ErrTooLarge, len(rt.out.Data)))
			return
		}
		r.fail(rt)
		return
	}
	w.expected++
	w.lastSubmitted = rt.seq
	rt.fut = fut
	r.writeIndex(rt, w.stream, w.expected)
	r.pipe.sent(rt)
}

// writeIndex places the index records of rt's write at (stream, seq) (the
// pipeline writes them once the write is stored), and adds its merge key's
// placement to the merge cache as in flight.
func (r *Router) writeIndex(rt *routing, stream string, seq uint64) {
	r.pipe.addIndex(rt, stream, seq)
	for _, rec := range rt.index[:rt.nIndex] {
		if index.IsMergeKey(rec.Key) {
			r.merges.submitted(rec)
		}
	}
}

// settleMerges moves rt's merge placement from in flight to the cache once
// its level write is confirmed (ok), or forgets it when the write failed.
func (r *Router) settleMerges(rt *routing, ok bool) {
	for _, rec := range rt.index[:rt.nIndex] {
		if index.IsMergeKey(rec.Key) {
			r.merges.settled(rec, ok)
		}
	}
}

// forgetMerge records that a merge key's message was cancelled: the key is
// free (rec is its "cancelled" record). Scanners call it.
func (r *Router) forgetMerge(rec index.Record) { r.merges.forget(rec) }

// writeConfirmed is the acker's report of a stored write ([ackSink]).
func (r *Router) writeConfirmed(rt *routing, ack *jetstream.PubAck) {
	r.settleMerges(rt, true)
	// Counted before the ack: once the ingress stream no longer holds the
	// message, its count is in [Router.Stats].
	if rt.w == nil {
		r.deadLettered.Add(1)
		r.wiring.reasons.add(reasonOf(rt.reason))
	} else {
		r.routed.Add(1)
	}
	rt.ack()
	r.failing.progress() // the session works
	if rt.w == nil {
		r.wiring.refused.stored(r.refusal + r.ingressRef(rt.seq))
		return
	}
	rt.w.failing.progress()
	rt.w.lastRouted.Store(rt.seq)
	r.cfg.OnRouted(rt.w.stream, ack.Sequence)
}

// writeRefused is the acker's report of a failed write ([ackSink]).
func (r *Router) writeRefused(rt *routing) {
	r.settleMerges(rt, false)
	if rt.invalid {
		r.deferDeadLetter(rt)
		return
	}
	r.fail(rt)
}

// tailSynced is the acker's report of a tail sync ([ackSink]).
func (r *Router) tailSynced(stream string, seq uint64) { r.cfg.OnRouted(stream, seq) }

// deadLetter sends the write of an ingress message to DELAYD_DLQ.
func (r *Router) deadLetter(rt *routing, reason error) {
	m := rt.msg
	// Once per message: a redelivery (its dead letter was refused) logs at debug.
	logLevel := slog.LevelWarn
	if meta, ok := jswire.ParseAck(m.Reply); ok && meta.Delivered > 1 {
		logLevel = slog.LevelDebug
	}
	r.logger.Log(context.Background(), logLevel, "dead-lettering invalid message", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	rt.w, rt.reason = nil, reason
	rt.out = deadLetterMsg(m.Subject, maps.Clone(m.Header), m.Data, reason, r.ingressRef(rt.seq))
	fut, err := r.acks.Publish(rt.out)
	if err != nil {
		rt.err = err
		if rt.invalid {
			r.deferDeadLetter(rt)
			return
		}
		r.fail(rt)
		return
	}
	rt.fut = fut
	r.pipe.sent(rt)
}

// routerRefusal prefixes the router's keys in dlqRefusals.
const routerRefusal = "router:"

// deferDeadLetter leaves an invalid message whose dead letter DELAYD_DLQ
// refused in the ingress stream, unacked: it is negatively acknowledged with
// a delay (capped backoff by its delivery count), so the ingress consumer
// delivers it again and its dead letter is tried again, deduped at
// DELAYD_DLQ by its Nats-Msg-Id (the ingress reference). It goes to no level
// stream, so routing the messages behind it keeps every level stream in
// ingress order. Nothing is acked before its dead letter is stored.
func (r *Router) deferDeadLetter(rt *routing) {
	first := r.wiring.refused.refused(r.refusal+r.ingressRef(rt.seq), rt.err)
	delay := 5 * time.Second
	if meta, ok := jswire.ParseAck(rt.msg.Reply); ok && meta.Delivered < 6 {
		delay = min(delay, 100*time.Millisecond<<meta.Delivered)
	}
	logLevel := slog.LevelWarn // the first refusal of this dead letter; its retries at debug
	if !first {
		logLevel = slog.LevelDebug
	}
	r.logger.Log(context.Background(), logLevel, "dead-letter write refused; the message stays in ingress and is tried again",
		slog.String("subject", rt.msg.Subject), slog.Uint64("ingress_seq", rt.seq), slog.Duration("retry_in", delay), slog.Any("error", rt.err))
	_ = rt.msg.Respond(fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()))
}

// fail records that rt's write failed, starting the failure clocks, to be
// retried by retryFailed.
func (r *Router) fail(rt *routing) {
	if rt.w != nil {
		rt.w.failing.fail(r.epoch)
	} else {
		r.failing.fail(r.epoch)
	}
	r.pipe.fail(rt)
}

// retryFailed redoes failed writes in ingress order after every in-flight
// write has settled, so each level stream stays in strict ingress order. A
// write the server refuses for good (too large once delayd's headers are
// added) is dead-lettered; any other failure is retried, with capped
// backoff, until it is stored or ctx is done.
func (r *Router) retryFailed(ctx context.Context) error {
	backoff := newBackoff(50*time.Millisecond, 5*time.Second)
	// The failure clocks run from the first failure (fail) until a write is
	// confirmed: a retry round, even one whose writes are all sent, is not
	// progress (they may fail again in the acker).
	for round := 0; ; round++ {
		r.pipe.drain()
		if !r.term.Held() {
			r.noteFenced(ctx)
			return errNotOwner // the failed writes stay unacked, for the next owner
		}
		failed := r.pipe.takeFailed()
		if len(failed) == 0 {
			return nil
		}
		slices.SortFunc(failed, func(a, b *routing) int { return compareUint(a.seq, b.seq) })
		for _, rt := range failed {
			rt.inProgress() // keep the ack wait from redelivering them meanwhile
		}
		r.logger.Warn("level writes failed; retrying in order", slog.Int("count", len(failed)), slog.Any("error", failed[0].err))
		if round > 0 && !backoff.sleep(ctx) {
			r.pipe.requeue(failed)
			return ctx.Err()
		}
		submitted := make([]uint64, len(r.writers))
		for i, w := range r.writers {
			submitted[i] = w.lastSubmitted
		}
		if err := r.syncTails(ctx); err != nil {
			r.pipe.requeue(failed)
			return err
		}
		if err := r.checkTails(submitted); err != nil {
			r.pipe.requeue(failed)
			return err
		}
		if !r.term.Held() {
			// Checked again after the resync's reads: a router paused
			// before them may have read a newer router's tail, and must
			// not write at it. Held now, the tails it read were read
			// before any newer term began, whose markers then refuse
			// every write expecting them.
			r.pipe.requeue(failed)
			r.noteFenced(ctx)
			return errNotOwner
		}
		for i, rt := range failed {
			if r.pipe.broken.Load() {
				// A write failed before it was sent; submitting later
				// messages of its level now would break ingress order.
				r.pipe.requeue(failed[i:])
				break
			}
			if rt.w == nil || tooLarge(rt.err) {
				// A dead letter of a message placed in a level's order, or
				// a level write refused for its size: nothing of its level
				// behind it may be written before it is stored.
				w := rt.w
				if err := r.deadLetterSync(ctx, rt); err != nil {
					logLevel := slog.LevelWarn // the first refusal; its retries at debug
					if !r.wiring.refused.refused(r.refusal+r.ingressRef(rt.seq), err) {
						logLevel = slog.LevelDebug
					}
					r.logger.Log(ctx, logLevel, "dead-letter write failed; retrying", slog.Uint64("ingress_seq", rt.seq), slog.Any("error", err))
					r.pipe.requeue(failed[i:])
					break
				}
				r.wiring.refused.stored(r.refusal + r.ingressRef(rt.seq))
				r.failing.progress()
				if w != nil {
					w.failing.progress()
				}
				continue
			}
			if rt.seq <= rt.w.lastRouted.Load() {
				r.skipped.Add(1)
				rt.ack()
				rt.w.failing.progress() // it was stored: its PubAck was lost
				continue
			}
			rt.err = nil
			r.submit(rt)
		}
	}
}

// noteFenced counts, for a term that ended with failed writes, the fence
// the failures may show: a write refused because its level stream was not
// at the last sequence it expected, where the stream's newest epoch marker
// is a newer term's (checkMarker counts it). Once, at the first such level
// stream; nothing if none. It reads even once ctx is done (the term's
// end may have cancelled it), each read bounded by opTimeout.
func (r *Router) noteFenced(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	checked := make(map[*levelWriter]bool)
	for _, rt := range r.pipe.failedWrites() {
		w := rt.w
		if w == nil || checked[w] || !wrongLastSeq(rt.err) {
			continue
		}
		checked[w] = true
		if errors.Is(r.checkMarker(ctx, w), errRouterFenced) {
			return
		}
	}
}

// checkTails checks, after a failed write's resync, that no level stream's
// last router write is past what this session submitted to it (submitted,
// by writer): within a session only this router writes, so one past it
// was written by a router of a newer term, whose epoch marker the scanners
// may have purged by now. It fences the router then: its refused writes
// must not be taken for stored. A router on its own (epoch 0) does not
// check.
func (r *Router) checkTails(submitted []uint64) error {
	if r.term.Epoch == 0 {
		return nil
	}
	for i, w := range r.writers {
		if got := w.lastRouted.Load(); got > submitted[i] {
			w.fenced.Add(1)
			return fmt.Errorf("%w: level stream %s holds ingress message %d, past this router's last write %d",
				errRouterFenced, w.stream, got, submitted[i])
		}
	}
	return nil
}

// deadLetterSync writes rt to DELAYD_DLQ and waits for the PubAck, then acks
// the ingress message. A dead letter that is itself too large is stored
// without its payload, then without its user headers, with the reason saying
// so: delayd's headers can push a message at the server's limits over them,
// and the dead letter must not loop.
func (r *Router) deadLetterSync(ctx context.Context, rt *routing) error {
	m := rt.msg
	reason := rt.reason
	if reason == nil {
		// A level write refused for its size: build its dead letter once,
		// from the untouched ingress message.
		reason = fmt.Errorf("%w: the level-stream write was refused: %v", ErrTooLarge, rt.err)
		rt.reason = reason
		rt.out = deadLetterMsg(m.Subject, maps.Clone(m.Header), m.Data, reason, r.ingressRef(rt.seq))
		r.logger.Warn("dead-lettering message too large for its level stream", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	}
	if err := publishDeadLetter(ctx, r.js, rt.out); err != nil {
		return err
	}
	if rt.nIndex > 0 {
		// Its write was never stored (a level write refused for its size,
		// or a dead letter whose own write failed: rt.w is nil then), so
		// none of its records was written; a hop's earlier placement is
		// still its latest record, and its merge key is in flight: record
		// that it left delayd, and settle the merge key.
		r.writeIndex(rt, "", 0)
		r.pipe.storeIndex(rt)
		r.settleMerges(rt, true)
	}
	r.deadLettered.Add(1)
	r.wiring.reasons.add(reasonOf(reason))
	rt.w = nil
	rt.ack()
	return nil
}

// ingressRef is the derived id of an ingress message: unique across the
// ingress stream's lives because it includes the stream's creation time.
func (r *Router) ingressRef(seq uint64) string {
	return "delayd-" + r.ingressID + "-" + strconv.FormatUint(seq, 10)
}

// parseIngressRef is the inverse of [Router.ingressRef].
func parseIngressRef(ref string) (id string, seq uint64, ok bool) {
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

func compareUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
