package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// Router defaults.
const (
	// RouterMaxInFlightDefault bounds level-stream writes awaiting their PubAck.
	RouterMaxInFlightDefault = 4096
	// RouterBatchDefault is how many ingress messages are pulled ahead.
	RouterBatchDefault = 1024
	// RouterConsumer is the durable name of the router's ingress consumer.
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

	reasons *reasonCounts // dead letters by reason, shared with the scanners (set by Service)
	refused *dlqRefusals  // dead letters DELAYD_DLQ refused, shared with the scanners (set by Service)

	// pending reports whether the level message at (stream, seq) has not
	// been handed to its target yet and is not cancelled; hop and due are
	// from its index record. Set by Service for merging; nil merges nothing.
	pending func(rec indexRecord) bool

	hopKey hopKey // authenticates cascading messages moving on (set by Service)

	// passed returns the highest sequence a level's scanner handed off.
	// Set by Service.
	passed func(stream string) uint64

	// committed returns a level stream's committed offset, for re-indexing
	// at start. Set by Service; nil re-indexes every candidate.
	committed func(stream string) uint64

	// OnRouted is called after a level-stream write is confirmed, with the
	// level stream's name and the sequence the write got, for observers such
	// as metrics. (Scanners need no nudge: their pending pull request
	// receives the message.) Optional.
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
	if err := c.Targets.Validate(); err != nil {
		return fmt.Errorf("deliver: router: target policy: %w", err)
	}
	return nil
}

// RouterStats are the router's counters since start.
type RouterStats struct {
	Routed       uint64 // messages written to a level stream and acked at ingress
	DeadLettered uint64 // invalid messages written to DELAYD_DLQ
	Clamped      uint64 // Delay-Level above the table, clamped to the highest level
	Skipped      uint64 // redeliveries already present in their level stream
	Merged       uint64 // messages merged into a pending one with the same merge key and target
	IndexErrors  uint64 // id index writes that failed (those messages cannot be cancelled)
}

// Router consumes DELAYD_INGRESS and writes each message to its level
// stream, or to DELAYD_DLQ with the reason when it is invalid.
//
// Exactly-once into level streams without a duplicate window: the router is
// the only writer of each level stream and writes with
// Nats-Expected-Last-Sequence, so a level stream holds its messages in strict
// ingress order. The ingress message is acked only after the level write's
// PubAck. After a crash or a failed write, the router reads the ingress
// sequence of each level stream's last message (the scanners never purge a
// level stream's last message): any ingress message at or below it is
// already stored and is only acked. This costs no server memory per message,
// unlike a Nats-Msg-Id duplicate window.
type Router struct {
	js     jetstream.JetStream
	cfg    RouterConfig
	logger *slog.Logger

	ingressID string         // unique to the ingress stream's life: its creation time
	writers   []*levelWriter // by level index, 0 = immediate

	inflight chan *routing
	pending  sync.WaitGroup
	mu       sync.Mutex
	failed   []*routing
	broken   atomic.Bool
	kick     chan struct{} // wakes the router loop when a write failed

	failing   failClock    // sessions or dead letters of placed messages failing; see Healthy
	epoch     time.Time    // the failure clocks' origin (monotonic reading)
	inflightN atomic.Int64 // writes handed to the acker and not settled yet
	tails     *batchReader

	group       *indexGroup // index records not yet written (router goroutine)
	mergeMu     sync.Mutex
	index       *batchReader           // index lookups (router goroutine)
	mergeFlight map[string]indexRecord // merge keys' placements whose level write is not confirmed yet
	mergeRecent map[string]indexRecord // the latest confirmed placement of merge keys placed by this process
	mergeOrder  []string               // mergeRecent's keys, oldest first, for eviction

	routed, deadLettered, clamped, skipped, merged, indexErrors atomic.Uint64
}

// levelWriter is the router's view of one level stream.
type levelWriter struct {
	level   levels.Level
	stream  string
	subject string // "delayd.level.<NAME>." + target

	expected      uint64        // the stream's last sequence before the next write (router goroutine)
	lastSubmitted uint64        // highest ingress sequence written, confirmed or not (router goroutine)
	lastRouted    atomic.Uint64 // highest ingress sequence confirmed in the stream
	failing       failClock     // its writes failing since; reset only by a confirmed write
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

// routing is one ingress message on its way.
type routing struct {
	msg    *nats.Msg    // the ingress message; Reply is its $JS.ACK subject
	seq    uint64       // ingress sequence
	w      *levelWriter // nil for a dead letter
	out    *nats.Msg
	fut    jetstream.PubAckFuture
	err    error
	reason error // why it is a dead letter

	// invalid: it goes to no level stream, only to DELAYD_DLQ, so routing
	// may pass it while its dead letter is refused (see deferDeadLetter).
	invalid bool

	merge  string         // Delay-Merge-Key, "" if none
	index  [2]indexRecord // the placement's records: by id, and by merge key if any
	nIndex int
	group  *indexGroup // the index write holding them

	// Headers levelMsg removed from msg, to restore them on a dead letter.
	shaped   bool // levelMsg ran on msg's header map
	removed  [2]hdrKV
	nRemoved int
	spill    []hdrKV
}

type hdrKV struct {
	key    string
	values []string
}

func (rt *routing) remember(k string, v []string) {
	if rt.nRemoved < len(rt.removed) {
		rt.removed[rt.nRemoved] = hdrKV{k, v}
		rt.nRemoved++
		return
	}
	rt.spill = append(rt.spill, hdrKV{k, v})
}

// originalHeader undoes levelMsg on the ingress message's header map: the
// headers delayd added are removed and the ones it removed are back.
func (rt *routing) originalHeader() nats.Header {
	h := rt.msg.Header
	if !rt.shaped || h == nil {
		return h
	}
	rt.shaped = false
	for _, k := range []string{contract.HeaderEnqueuedAt, contract.HeaderDueAt, hdrIngress, hdrMsgID, jetstream.ExpectedLastSeqHeader} {
		delete(h, k)
	}
	for _, kv := range rt.removed[:rt.nRemoved] {
		h[kv.key] = kv.values
	}
	for _, kv := range rt.spill {
		h[kv.key] = kv.values
	}
	return h
}

func (rt *routing) ack() { _ = rt.msg.Respond(ackAck) }

func (rt *routing) inProgress() { _ = rt.msg.Respond(ackInProgress) }

// NewRouter returns a router. The streams must exist; see [Service].
func NewRouter(js jetstream.JetStream, cfg RouterConfig) (*Router, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Router{js: js, cfg: cfg, logger: cfg.Logger, kick: make(chan struct{}, 1), mergeRecent: make(map[string]indexRecord), mergeFlight: make(map[string]indexRecord), epoch: time.Now()}
	all := append([]levels.Level{{}}, cfg.Levels.Levels()...)
	all = append(all, cfg.Levels.PrecisionLevels()...)
	for _, l := range all {
		w := &levelWriter{level: l, stream: l.Stream(), subject: levelSubjects + l.Name() + "."}
		r.writers = append(r.writers, w)
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
	return RouterStats{
		Routed: r.routed.Load(), DeadLettered: r.deadLettered.Load(), Clamped: r.clamped.Load(), Skipped: r.skipped.Load(),
		Merged: r.merged.Load(), IndexErrors: r.indexErrors.Load(),
	}
}

// Run routes until ctx is done, then lets in-flight writes finish (or
// abandons them: their ingress messages stay unacked and are routed again,
// without duplicates, on the next start) and returns nil. It survives server
// restarts and reconnects; it returns an error only for a bad setup.
func (r *Router) Run(ctx context.Context) error {
	tails, err := newBatchReader(r.js.Conn(), tailBatch)
	if err != nil {
		return err
	}
	defer tails.close()
	r.tails = tails
	index, err := newBatchReader(r.js.Conn(), indexBatch)
	if err != nil {
		return err
	}
	defer index.close()
	r.index = index
	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		began := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
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
	info, err := r.js.Stream(ctx, IngressStream)
	if err != nil {
		return fmt.Errorf("ingress stream: %w", err)
	}
	r.ingressID = strconv.FormatInt(info.CachedInfo().Created.UnixNano(), 10)
	if err := r.syncTails(ctx); err != nil {
		return err
	}
	if err := r.reindex(ctx, info.CachedInfo().State); err != nil {
		return err
	}
	// A fresh consumer redelivers every unacked ingress message at once,
	// instead of after the ack wait of a consumer left by a crashed process.
	if err := r.js.DeleteConsumer(ctx, IngressStream, RouterConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("reset ingress consumer: %w", err)
	}
	_, err = r.js.CreateOrUpdateConsumer(ctx, IngressStream, jetstream.ConsumerConfig{
		Durable:       RouterConsumer,
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
	pull, err := newPullLoop(r.js.Conn(), IngressStream, RouterConsumer, r.cfg.Batch, 0)
	if err != nil {
		return err
	}
	// The fresh consumer redelivers every unacked message: dead letters
	// still refused are recorded again when they are.
	r.cfg.refused.forget(routerRefusal)
	stop := context.AfterFunc(ctx, pull.stop)
	defer stop()
	defer pull.stop()

	r.inflight = make(chan *routing, r.cfg.MaxInFlight)
	ackerDone := make(chan struct{})
	go r.acker(r.inflight, ackerDone)
	defer func() {
		r.flushIndex()
		close(r.inflight)
		<-ackerDone
	}()

	for {
		if r.broken.Load() {
			if err := r.recover(ctx); err != nil {
				return err
			}
		}
		m, err := pull.next(ctx, r.kick, false, 0)
		if m == nil && err == nil {
			// Nothing waiting: store the index records routed so far.
			r.flushIndex()
			// Nothing in flight and nothing failed: caught up, which is
			// progress. (In flight is read first: the acker records a
			// failure before it settles the write.)
			if r.inflightN.Load() == 0 && !r.broken.Load() {
				r.progress()
			}
			m, err = pull.next(ctx, r.kick, true, 0)
		}
		if errors.Is(err, errWoken) {
			continue // a write failed: recover before the next message
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("ingress: %w", err)
		}
		r.route(m)
	}
}

// syncTails syncs every level writer and tells the scanners each stream's
// last sequence: a write whose PubAck was lost is found here, not acked.
func (r *Router) syncTails(ctx context.Context) error {
	for _, w := range r.writers {
		if err := r.syncTail(ctx, w); err != nil {
			return err
		}
		if w.expected > 0 {
			r.cfg.OnRouted(w.stream, w.expected)
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
		if err = ensureLevelStream(ctx, r.js, w.level.Delay, max(r.cfg.Replicas, 1)); err == nil {
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
	if last > 0 {
		seq, err := r.lastIngressRef(ctx, w.stream, st)
		if err != nil {
			return err
		}
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

// lastIngressRef returns the ingress sequence of the last message of a
// level stream (state st) that the router wrote for this ingress stream's
// life, read from its Delayd-Ingress header; 0 when there is none. A last
// message without a valid reference was not written by the router
// (something else published to the level subject): the router walks back
// over it, up to tailWalkBack messages, to its own last write, and logs
// it. Found nowhere, ingress messages not yet acked may be written to the
// level stream again, and that is logged too.
func (r *Router) lastIngressRef(ctx context.Context, stream string, st jetstream.StreamState) (uint64, error) {
	var buf []*nats.Msg
	first := max(st.FirstSeq, 1)
	for to := st.LastSeq; to >= first && st.LastSeq-to < tailWalkBack; {
		from := first
		if to-first >= tailBatch {
			from = to - tailBatch + 1
		}
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		var err error
		buf, err = r.tails.read(rctx, stream, buf[:0], from, int(to-from+1), 1<<20)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("level stream %s tail: %w", stream, err)
		}
		if to == st.LastSeq && (len(buf) == 0 || buf[len(buf)-1].Header.Get(hdrJSSequence) != strconv.FormatUint(st.LastSeq, 10)) {
			r.logger.Warn("level stream tail missing; redelivered ingress messages may be written twice", slog.String("stream", stream))
			return 0, nil
		}
		for i := len(buf) - 1; i >= 0; i-- {
			m := buf[i]
			seq, _ := strconv.ParseUint(m.Header.Get(hdrJSSequence), 10, 64)
			if seq > to {
				continue // past this read's range (a byte-limited read returns fewer)
			}
			id, ingressSeq, ok := parseIngressRef(m.Header.Get(hdrIngress))
			if ok {
				if seq != st.LastSeq {
					r.logger.Warn("level stream's last messages have no valid ingress reference (not written by delayd); synced to the last one that has",
						slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("synced_seq", seq))
				}
				if id != r.ingressID {
					return 0, nil // written for an earlier ingress stream
				}
				return ingressSeq, nil
			}
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
	return 0, nil
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
	g := newIndexGroup()
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
		if r.cfg.committed != nil {
			from = max(from, r.cfg.committed(w.stream)+1)
		}
		for from <= w.expected {
			rctx, cancel := context.WithTimeout(ctx, opTimeout)
			var err error
			buf, err = r.index.read(rctx, w.stream, buf[:0], from, indexBatch, 1<<20)
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
				if !ok || ing < ingress.FirstSeq || seq > w.expected {
					continue
				}
				due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
				_, hop := m.Header[hdrHopDue]
				target := strings.TrimPrefix(m.Header.Get(hdrJSSubject), w.subject)
				if key := levelKey(m.Header); key != "" {
					g.add(indexRecord{key: key, stream: w.stream, seq: seq, hop: hop, due: due, target: target})
				}
				if mk := m.Header.Get(hdrMerge); mk != "" {
					rec := indexRecord{key: mergeKey(target, mk), stream: w.stream, seq: seq, hop: hop, due: due, target: target}
					g.add(rec)
					r.rememberMerge(rec)
				}
				n++
			}
		}
	}
	if n == 0 {
		return nil
	}
	g.flush(r.js)
	if err := g.stored(); err != nil {
		return fmt.Errorf("re-index: %w", err)
	}
	r.logger.Info("re-indexed level messages whose ingress message was not acked", slog.Int("messages", n))
	return nil
}

// route classifies one ingress message and starts its write.
func (r *Router) route(m *nats.Msg) {
	meta, ok := parseAck(m.Reply)
	if !ok {
		r.logger.Error("ingress message with an unreadable ack subject", slog.String("reply", m.Reply))
		_ = m.Respond(ackTerm)
		return
	}
	rt := &routing{msg: m, seq: meta.streamSeq}
	lvl, target, due, err := r.classify(m, meta.stored)
	if err == nil {
		rt.merge, err = mergeKeyOf(m.Header)
	}
	if err != nil {
		rt.invalid = true
		r.deadLetter(rt, err)
		return
	}
	w := r.writers[lvl.Index]
	if rt.seq <= w.lastRouted.Load() {
		r.skipped.Add(1)
		rt.ack()
		return
	}
	if rt.seq <= w.lastSubmitted {
		return // a redelivery of a write still in flight; its PubAck acks it
	}
	if rt.merge != "" && !(m.Header.Get(hdrOrigin) != "" && r.cfg.hopKey.valid(m.Subject, m.Header)) && r.mergeInto(target, rt.merge) {
		// Merged into the pending first message with this key and target:
		// its payload is dropped, the first is delivered at its due time.
		r.merged.Add(1)
		rt.ack()
		return
	}
	rt.w = w
	r.levelMsg(rt, target, meta.stored, due)
	r.submit(rt)
}

// mergeKeyOf returns a message's Delay-Merge-Key, "" if it has none. An
// empty or repeated value is invalid input.
func mergeKeyOf(h nats.Header) (string, error) {
	for k, v := range h {
		if !strings.EqualFold(k, contract.HeaderMergeKey) {
			continue
		}
		if len(v) != 1 || strings.TrimSpace(v[0]) == "" {
			return "", fmt.Errorf("%w: %s needs exactly one non-empty value", ErrInvalidMergeKey, contract.HeaderMergeKey)
		}
		return strings.TrimSpace(v[0]), nil
	}
	return "", nil
}

// mergeInto reports whether a message with merge key key for target has a
// pending first message to be merged into: one written in this session and
// not yet confirmed, or one the index places in a level stream that has not
// handed it to its target yet. A lookup that fails merges nothing: the
// message is then delivered on its own, never lost.
func (r *Router) mergeInto(target, key string) bool {
	if r.cfg.pending == nil {
		return false
	}
	k := mergeKey(target, key)
	r.mergeMu.Lock()
	rec, ok := r.mergeFlight[k]
	if !ok {
		rec, ok = r.mergeRecent[k]
	}
	r.mergeMu.Unlock()
	if !ok {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		var err error
		rec, ok, err = lookupIndex(ctx, r.index, k)
		if err == nil && ok && rec.stream != "" && !rec.gone {
			ok, err = r.placed(ctx, rec, target, key)
		}
		if err != nil {
			r.logger.Warn("merge lookup failed; delivering the message on its own", slog.Any("error", err))
			return false
		}
	}
	return ok && rec.stream != "" && !rec.gone && r.cfg.pending(rec)
}

// placed reports whether an index record of merge key key for target names
// a stored placement: the message at its sequence has that key and target.
// A record can outlive a level write that failed (it was written in the
// same group as other records, then delayd crashed): its sequence is then
// empty, or holds another message. A cascading message already moved on
// (purged from the level) counts as placed: its record is the latest, so it
// has not been placed again yet.
func (r *Router) placed(ctx context.Context, rec indexRecord, target, key string) (bool, error) {
	msgs, err := r.index.read(ctx, rec.stream, nil, rec.seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(msgs) == 0 || msgs[0].Header.Get(hdrJSSequence) != strconv.FormatUint(rec.seq, 10) {
		return rec.hop && r.cfg.passed != nil && rec.seq <= r.cfg.passed(rec.stream), nil
	}
	prefix := levelSubjects + strings.TrimPrefix(rec.stream, levels.StreamPrefix) + "."
	subject := msgs[0].Header.Get(hdrJSSubject)
	return msgs[0].Header.Get(hdrMerge) == key && strings.HasPrefix(subject, prefix) && subject[len(prefix):] == target, nil
}

// classify finds the level, target and due time of an ingress message
// stored at stored. due is zero for a Delay-Level message (its level's
// delay decides); for Delay-Duration and Delay-Deliver-At it is the
// requested time, and the level is the first stage of the cascade.
func (r *Router) classify(m *nats.Msg, stored time.Time) (levels.Level, string, time.Time, error) {
	target, err := contract.Target(m.Subject, r.cfg.Prefix)
	if err == nil {
		err = r.cfg.Targets.Check(target)
	}
	if err != nil {
		return levels.Level{}, "", time.Time{}, err
	}
	var (
		key, value string
		kinds, n   int
		seen       [3]bool
	)
	for k, v := range m.Header {
		for i, h := range [3]string{contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt} {
			if !strings.EqualFold(k, h) {
				continue
			}
			if !seen[i] {
				seen[i], kinds, key = true, kinds+1, h
			}
			n += len(v)
			if len(v) > 0 {
				value = v[0]
			}
		}
	}
	switch {
	case kinds == 0:
		return levels.Level{}, "", time.Time{}, fmt.Errorf("%w: no %s, %s or %s header", levels.ErrMissingLevel, contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt)
	case kinds > 1:
		return levels.Level{}, "", time.Time{}, fmt.Errorf("%w: ambiguous: set exactly one of %s, %s and %s", ErrInvalidDelay, contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt)
	case n > 1:
		return levels.Level{}, "", time.Time{}, fmt.Errorf("%w: %s has %d values, want one", delayErr(key), key, n)
	}
	if key != contract.HeaderLevel {
		due, err := r.requestedDue(key, strings.TrimSpace(value), stored)
		if err != nil {
			return levels.Level{}, "", time.Time{}, err
		}
		return r.cascadeLevel(due.Sub(stored)), target, due, nil
	}
	lvl, clamped, err := r.cfg.Levels.Pick(value)
	if err != nil {
		return levels.Level{}, "", time.Time{}, err
	}
	if clamped {
		r.clamped.Add(1)
		r.logger.Warn("delay level above the table, clamped to the highest level",
			slog.String("value", strings.TrimSpace(value)), slog.String("delay_level", lvl.Name()), slog.String("subject", m.Subject))
	}
	return lvl, target, time.Time{}, nil
}

// delayErr is the sentinel for a bad value of the delay header key:
// [levels.ErrInvalidLevel] for Delay-Level, [ErrInvalidDelay] for the others.
func delayErr(key string) error {
	if key == contract.HeaderLevel {
		return levels.ErrInvalidLevel
	}
	return ErrInvalidDelay
}

// requestedDue parses a Delay-Duration or Delay-Deliver-At value.
func (r *Router) requestedDue(key, value string, stored time.Time) (time.Time, error) {
	var due time.Time
	if key == contract.HeaderDuration {
		d, err := time.ParseDuration(value)
		switch {
		case err != nil:
			return due, fmt.Errorf("%w: %s %q is not a Go duration such as 90s or 36h", ErrInvalidDelay, key, value)
		case d < 0:
			return due, fmt.Errorf("%w: %s %q is negative", ErrInvalidDelay, key, value)
		}
		due = stored.Add(d)
	} else {
		t, err := time.Parse(time.RFC3339Nano, value)
		if err != nil {
			return due, fmt.Errorf("%w: %s %q is not an RFC 3339 time", ErrInvalidDelay, key, value)
		}
		due = t
	}
	if due.Sub(stored) > r.cfg.MaxDelay {
		return due, fmt.Errorf("%w: %s %q is beyond the longest delay %s (DELAYD_MAX_DELAY)", ErrInvalidDelay, key, value, levels.FormatDuration(r.cfg.MaxDelay))
	}
	return due, nil
}

// cascadeLevel picks the level for a remaining delay: the longest level not
// longer than it, so the message never waits past its due time. Below the
// table's shortest level, the longest precision level not longer than it
// (levels.Table.PrecisionLevels); below 1 ms, or nothing remaining, level 0,
// whose scanner waits for the due time itself.
func (r *Router) cascadeLevel(remaining time.Duration) levels.Level {
	all := r.cfg.Levels.Levels()
	if remaining < all[0].Delay {
		all = r.cfg.Levels.PrecisionLevels()
	}
	var pick levels.Level
	for _, l := range all {
		if l.Delay <= remaining {
			pick = l
		}
	}
	return pick
}

// levelMsg turns an ingress message into its level-stream message, reusing
// its header map and payload. It removes control headers, JetStream
// instruction headers (Nats-*, which acted on the ingress stream and must not
// act again) and reserved Delayd-* headers, and adds the delivery headers.
func (r *Router) levelMsg(rt *routing, target string, stored, due time.Time) {
	m, w := rt.msg, rt.w
	rt.shaped = true
	h := m.Header
	if h == nil {
		h = make(nats.Header, 5)
		m.Header = h
	}
	// A message moving on from an earlier level (a hop) carries its first
	// ingress id, its first enqueue time and its publisher's id.
	origin := h.Get(hdrOrigin)
	hop := origin != ""
	if hop && !r.cfg.hopKey.valid(m.Subject, h) {
		// Not moved on by delayd: a publisher's own Delayd-* headers.
		r.logger.Warn("message with delayd's hop headers but no valid hop MAC; routed as a new message", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq))
		hop, origin = false, ""
	}
	var userID, enqueued, hops string
	if hop {
		userID, enqueued, hops = h.Get(hdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(hdrHops)
		rt.merge = h.Get(hdrMerge)
	}
	for k, v := range h {
		if contract.IsControlHeader(k) || contract.IsInternalHeader(k) {
			if !hop && strings.EqualFold(k, contract.HeaderNatsMsgID) && len(v) > 0 {
				userID = v[0]
			}
			rt.remember(k, v)
			delete(h, k)
		}
	}
	if enqueued == "" {
		enqueued = contract.FormatTime(stored)
	}
	levelDue := stored.Add(w.level.Delay)
	switch {
	case due.IsZero(): // a Delay-Level message
		due = levelDue
	case due.Before(stored) && !hop: // a Delay-Deliver-At in the past: now
		due = stored
	case due.Before(stored): // a hop that arrives overdue (delayd was down): at once, due unchanged
	case levelDue.Before(due) && w.level.Delay > 0: // more to wait after this level: it moves on
		h[hdrHopDue] = []string{contract.FormatTime(levelDue)}
	}
	h[contract.HeaderEnqueuedAt] = []string{enqueued}
	h[contract.HeaderDueAt] = []string{contract.FormatTime(due)}
	h[hdrIngress] = []string{r.ingressRef(rt.seq)}
	if userID != "" {
		h[hdrMsgID] = []string{userID}
	}
	if hop {
		h[hdrOrigin] = []string{origin}
		h[hdrHops] = []string{hops}
	}
	if rt.merge != "" {
		h[hdrMerge] = []string{rt.merge}
	}
	rt.out = &nats.Msg{Subject: w.subject + target, Header: h, Data: m.Data}

	// The index records of this placement: by id (the publisher's, else
	// the first ingress sequence) and by merge key.
	_, isHop := h[hdrHopDue]
	rt.index[0] = indexRecord{key: levelKey(h), stream: w.stream, hop: isHop, due: due, target: target}
	rt.nIndex = 1
	if rt.merge != "" {
		rt.index[1] = indexRecord{key: mergeKey(target, rt.merge), stream: w.stream, hop: isHop, due: due, target: target}
		rt.nIndex = 2
	}
}

// submit starts the level write of rt.
func (r *Router) submit(rt *routing) {
	w := rt.w
	rt.out.Header[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(w.expected, 10)}
	fut, err := r.js.PublishMsgAsync(rt.out)
	if err != nil {
		rt.err = err
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused before it was sent: nothing to resync, order is kept.
			// A cascading message's earlier placement is still its latest
			// index record: record that it left delayd.
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
	r.pending.Add(1)
	r.inflightN.Add(1)
	r.enqueue(rt)
}

// writeIndex adds the index records of rt's placement at (stream, seq) to
// the current index group. They are stored before the ingress message is
// acked: the group is written when it is full, when no ingress message is
// waiting, and before a recovery or the end of a session.
func (r *Router) writeIndex(rt *routing, stream string, seq uint64) {
	if r.group == nil {
		r.group = newIndexGroup()
	}
	for i := range rt.nIndex {
		rec := &rt.index[i]
		rec.stream, rec.seq = stream, seq
		if rec.key[0] == 'm' {
			r.mergeMu.Lock()
			r.mergeFlight[rec.key] = *rec
			r.mergeMu.Unlock()
		}
		r.group.add(*rec)
	}
	rt.group = r.group
	r.group.n++
	// Fewer than MaxInFlight placements wait for a group, so the acker
	// never waits for a group the router cannot write.
	if r.group.n >= max(1, min(indexGroupMax, r.cfg.MaxInFlight/2)) {
		r.flushIndex()
	}
}

// flushIndex starts the writes of the current index group.
func (r *Router) flushIndex() {
	if r.group != nil {
		r.group.flush(r.js)
		r.group = nil
	}
}

// enqueue hands rt to the acker. When the acker's queue is full, the
// current index group is written first: the acker may be waiting for it
// (a long run of dead letters adds no placements to fill the group).
func (r *Router) enqueue(rt *routing) {
	select {
	case r.inflight <- rt:
	default:
		r.flushIndex()
		r.inflight <- rt
	}
}

// settleIndex waits until rt's index records are stored.
func (r *Router) settleIndex(rt *routing) {
	if rt.group != nil {
		if err := rt.group.stored(); err != nil {
			r.indexErrors.Add(1)
			r.logger.Warn("id index write failed; the message cannot be cancelled", slog.Any("error", err))
		}
		rt.group = nil
	}
}

// confirmMerge moves rt's merge placement from in flight to the cache once
// its level write is confirmed; dropMerge forgets it when the write failed
// (it is routed again, and must not merge into its own failed placement).
func (r *Router) confirmMerge(rt *routing, ok bool) {
	for i := range rt.nIndex {
		rec := rt.index[i]
		if rec.key[0] != 'm' {
			continue
		}
		r.mergeMu.Lock()
		cur, inFlight := r.mergeFlight[rec.key]
		if inFlight && cur.stream == rec.stream && cur.seq == rec.seq {
			delete(r.mergeFlight, rec.key)
		}
		r.mergeMu.Unlock()
		if ok && inFlight && cur.stream == rec.stream && cur.seq == rec.seq {
			r.rememberMerge(rec)
		}
	}
}

// forgetMerge records that a merge key's message was cancelled: the key is
// free (rec is its "cancelled" record).
func (r *Router) forgetMerge(rec indexRecord) {
	r.mergeMu.Lock()
	delete(r.mergeFlight, rec.key)
	r.mergeMu.Unlock()
	r.rememberMerge(rec)
}

// rememberMerge caches the latest confirmed placement of a merge key, so
// the next message with the key is merged without an index lookup. The
// router is the only writer of placements, so a key it placed is current in
// the cache until evicted (oldest first, beyond mergeCacheMax keys).
func (r *Router) rememberMerge(rec indexRecord) {
	r.mergeMu.Lock()
	defer r.mergeMu.Unlock()
	if _, ok := r.mergeRecent[rec.key]; !ok {
		if len(r.mergeOrder) >= mergeCacheMax {
			delete(r.mergeRecent, r.mergeOrder[0])
			r.mergeOrder = r.mergeOrder[1:]
		}
		r.mergeOrder = append(r.mergeOrder, rec.key)
	}
	r.mergeRecent[rec.key] = rec
}

// deadLetter starts the write of an ingress message to DELAYD_DLQ.
func (r *Router) deadLetter(rt *routing, reason error) {
	m := rt.msg
	// Once per message: a redelivery (its dead letter was refused) logs at debug.
	logLevel := slog.LevelWarn
	if meta, ok := parseAck(m.Reply); ok && meta.delivered > 1 {
		logLevel = slog.LevelDebug
	}
	r.logger.Log(context.Background(), logLevel, "dead-lettering invalid message", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	rt.w, rt.reason = nil, reason
	rt.out = deadLetterMsg(m.Subject, rt.originalHeader(), m.Data, reason, r.ingressRef(rt.seq))
	fut, err := r.js.PublishMsgAsync(rt.out)
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
	r.pending.Add(1)
	r.inflightN.Add(1)
	r.enqueue(rt)
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
	first := r.cfg.refused.refused(routerRefusal+r.ingressRef(rt.seq), rt.err)
	delay := 5 * time.Second
	if meta, ok := parseAck(rt.msg.Reply); ok && meta.delivered < 6 {
		delay = min(delay, 100*time.Millisecond<<meta.delivered)
	}
	logLevel := slog.LevelWarn // the first refusal of this dead letter; its retries at debug
	if !first {
		logLevel = slog.LevelDebug
	}
	r.logger.Log(context.Background(), logLevel, "dead-letter write refused; the message stays in ingress and is tried again",
		slog.String("subject", rt.msg.Subject), slog.Uint64("ingress_seq", rt.seq), slog.Duration("retry_in", delay), slog.Any("error", rt.err))
	_ = rt.msg.Respond(fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()))
}

// acker confirms writes in order and acks their ingress messages.
func (r *Router) acker(in <-chan *routing, done chan<- struct{}) {
	defer close(done)
	for rt := range in {
		select {
		case ack := <-rt.fut.Ok():
			r.settleIndex(rt)
			r.confirmMerge(rt, true)
			rt.ack()
			r.failing.progress() // the session works
			if rt.w == nil {
				r.cfg.refused.stored(routerRefusal + r.ingressRef(rt.seq))
				r.deadLettered.Add(1)
				r.cfg.reasons.add(reasonOf(rt.reason))
			} else {
				r.routed.Add(1)
				rt.w.failing.progress()
				rt.w.lastRouted.Store(rt.seq)
				r.cfg.OnRouted(rt.w.stream, ack.Sequence)
			}
		case err := <-rt.fut.Err():
			rt.err = err
			r.settleIndex(rt) // superseded by the records of the retried write
			r.confirmMerge(rt, false)
			if rt.invalid {
				r.deferDeadLetter(rt)
			} else {
				r.fail(rt)
			}
		}
		r.inflightN.Add(-1)
		r.pending.Done()
	}
}

func (r *Router) fail(rt *routing) {
	if rt.w != nil {
		rt.w.failing.fail(r.epoch)
	} else {
		r.failing.fail(r.epoch)
	}
	r.mu.Lock()
	r.failed = append(r.failed, rt)
	r.mu.Unlock()
	r.broken.Store(true)
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// recover redoes failed writes in ingress order after every in-flight write
// has settled, so each level stream stays in strict ingress order. A write
// the server refuses for good (too large once delayd's headers are added) is
// dead-lettered; any other failure is retried, with capped backoff, until it
// is stored or ctx is done.
func (r *Router) recover(ctx context.Context) error {
	backoff := newBackoff(50*time.Millisecond, 5*time.Second)
	// The failure clocks run from the first failure (fail) until a write is
	// confirmed: a retry round, even one whose writes are all sent, is not
	// progress (they may fail again in the acker).
	for round := 0; ; round++ {
		r.flushIndex()
		r.pending.Wait()
		r.mu.Lock()
		failed := r.failed
		r.failed = nil
		r.broken.Store(false)
		r.mu.Unlock()
		if len(failed) == 0 {
			return nil
		}
		slices.SortFunc(failed, func(a, b *routing) int { return compareUint(a.seq, b.seq) })
		for _, rt := range failed {
			rt.inProgress() // keep the ack wait from redelivering them meanwhile
		}
		r.logger.Warn("level writes failed; retrying in order", slog.Int("count", len(failed)), slog.Any("error", failed[0].err))
		if round > 0 && !backoff.sleep(ctx) {
			r.requeue(failed)
			return ctx.Err()
		}
		if err := r.syncTails(ctx); err != nil {
			r.requeue(failed)
			return err
		}
		for i, rt := range failed {
			if r.broken.Load() {
				// A write failed before it was sent; submitting later
				// messages of its level now would break ingress order.
				r.requeue(failed[i:])
				break
			}
			if rt.w == nil || tooLarge(rt.err) {
				// A dead letter of a message placed in a level's order, or
				// a level write refused for its size: nothing of its level
				// behind it may be written before it is stored.
				w := rt.w
				if err := r.deadLetterSync(ctx, rt); err != nil {
					logLevel := slog.LevelWarn // the first refusal; its retries at debug
					if !r.cfg.refused.refused(routerRefusal+r.ingressRef(rt.seq), err) {
						logLevel = slog.LevelDebug
					}
					r.logger.Log(ctx, logLevel, "dead-letter write failed; retrying", slog.Uint64("ingress_seq", rt.seq), slog.Any("error", err))
					r.requeue(failed[i:])
					break
				}
				r.cfg.refused.stored(routerRefusal + r.ingressRef(rt.seq))
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

// deadLetterSync writes rt to DELAYD_DLQ and waits for the PubAck, then acks
// the ingress message. A dead letter that is itself too large is stored
// without its payload, then without its user headers, with the reason saying
// so: delayd's headers can push a message at the server's limits over them,
// and the dead letter must not loop.
func (r *Router) deadLetterSync(ctx context.Context, rt *routing) error {
	m := rt.msg
	reason := rt.reason
	if reason == nil {
		// A level write refused for its size: build its dead letter once.
		reason = fmt.Errorf("%w: the level-stream write was refused: %v", ErrTooLarge, rt.err)
		rt.reason = reason
		rt.out = deadLetterMsg(m.Subject, rt.originalHeader(), m.Data, reason, r.ingressRef(rt.seq))
		r.logger.Warn("dead-lettering message too large for its level stream", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	}
	if err := publishDeadLetter(ctx, r.js, rt.out); err != nil {
		return err
	}
	if rt.w != nil && rt.nIndex > 0 {
		// Its placement records point at a sequence another message will
		// take: supersede them with "left delayd".
		r.writeIndex(rt, "", 0)
		r.flushIndex()
		r.settleIndex(rt)
		r.confirmMerge(rt, true)
	}
	r.deadLettered.Add(1)
	r.cfg.reasons.add(reasonOf(reason))
	rt.w = nil
	rt.ack()
	return nil
}

// requeue puts rts back to be retried.
func (r *Router) requeue(rts []*routing) {
	r.mu.Lock()
	r.failed = append(rts, r.failed...)
	r.mu.Unlock()
	r.broken.Store(true)
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
