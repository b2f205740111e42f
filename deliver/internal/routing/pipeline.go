package routing

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
)

// ackSink is what the write pipeline's confirmer reports to, in ingress
// order, on one goroutine. The router implements it.
type ackSink interface {
	// writeConfirmed: rt's write (level or dead letter) is stored as ack
	// says, and its index records are stored or their failure counted.
	writeConfirmed(rt *routing, ack *jetstream.PubAck)
	// writeRefused: rt's write failed with rt.err (set); none of its
	// index records was written.
	writeRefused(rt *routing)
	// tailSynced: a level stream's last sequence, read by a tail sync.
	tailSynced(stream string, seq uint64)
}

// writePipeline is the router's ordered write pipeline: level and
// dead-letter writes sent asynchronously, and an acker confirming them in
// ingress order.
//
// A write's index records are written only once the write is stored (its
// PubAck), and the write is reported confirmed (its ingress message acked)
// only once they are stored too. So a write the server refuses leaves no
// record: a router fenced by a newer router's epoch marker writes none
// that points at a sequence the newer router's messages or marker took
// (docs/guarantees.md#finding-the-message-without-per-message-memory).
//
// Three goroutines run it, each on methods of its own. The submitting
// goroutine (the router's session) calls writePipeline's methods but
// acker. The acker (writePipeline.acker), which the pipeline starts per
// session, takes the writes in order, waits for each one's PubAck or
// error, packs the stored ones' records into an index group, starts the
// group's writes and hands the batch to the confirmer; the [confirmer],
// on a goroutine the acker starts, waits for the group to be stored and
// reports each write to the sink, which adds a refused one to the
// [retryQueue] (lock-guarded, shared with the submitting goroutine). None
// waits for a goroutine before it in that chain, so they cannot wait on
// each other. [Router.Stats] reads indexErrors only (an atomic), from any
// goroutine.
type writePipeline struct {
	js       jetstream.JetStream
	logger   *slog.Logger
	groupMax int       // placements one index group packs at most
	queue    int       // the acker queue's capacity
	confirm  confirmer // the last stage, on the confirmer's goroutine

	// Submitting goroutine only.
	toAcker chan<- ackItem  // the acker's queue
	done    <-chan struct{} // closed when the acker and the confirmer have returned

	pending   sync.WaitGroup // writes sent and not settled by the confirmer
	inflightN atomic.Int64   // the same, readable from anywhere
	kick      chan struct{}  // wakes the submitting goroutine (nudge): a write failed, a level sync reported, held messages are due their progress acks

	groupsOut atomic.Int64  // index groups handed to the confirmer and not settled
	settled   chan struct{} // the confirmer settled a group (capacity 1)

	retry retryQueue // failed writes, shared by the submitting goroutine and the confirmer (lock-guarded)

	indexErrors atomic.Uint64 // writes whose index records failed

	loseIndex func() bool // tests: an index write's copy whose PubAck is lost (index.Group.LoseAnswers); set before start
}

// ackItem is a write for the acker to confirm, or a tail report.
type ackItem struct {
	rt     *routing
	stream string // a tail report: rt is nil
	seq    uint64
	ack    *jetstream.PubAck // set by the acker: the write's PubAck; nil if it failed
}

// ackBatch is consecutive acker items and the index group holding the
// records of the stored writes among them (nil if none has records).
type ackBatch struct {
	items []ackItem
	group *index.Group
}

// newWritePipeline returns a pipeline for at most maxInFlight writes
// awaiting their PubAck.
func newWritePipeline(js jetstream.JetStream, logger *slog.Logger, sink ackSink, maxInFlight int) *writePipeline {
	p := &writePipeline{
		js: js, logger: logger,
		groupMax: max(1, min(index.GroupMax, maxInFlight/2)), queue: max(0, maxInFlight-1),
		kick: make(chan struct{}, 1), settled: make(chan struct{}, 1),
	}
	p.confirm = confirmer{sink: sink, logger: logger, p: p}
	p.retry.kick = p.kick
	return p
}

// start starts the acker and the confirmer for a session.
func (p *writePipeline) start() {
	q := make(chan ackItem, p.queue)
	done := make(chan struct{})
	p.toAcker, p.done = q, done
	go p.acker(q, done)
}

// stop waits for the acker and the confirmer to settle every write sent
// and return.
func (p *writePipeline) stop() {
	close(p.toAcker)
	<-p.done
}

// addRecords places the index records of rt's write at (stream, seq); stream
// "" records that the message left delayd. The acker writes them once the
// write is stored, before its ingress message is acked.
func (p *writePipeline) addRecords(rt *routing, stream string, seq uint64) {
	for i := range rt.nRecords {
		rt.records[i].Stream, rt.records[i].Seq = stream, seq
	}
}

// storeRecords writes rt's index records now and waits until they are
// stored: for a write confirmed outside the pipeline (a dead letter
// written synchronously). A failure is counted and logged.
func (p *writePipeline) storeRecords(rt *routing) {
	if rt.nRecords == 0 {
		return
	}
	g := p.newGroup()
	for _, rec := range rt.records[:rt.nRecords] {
		g.Add(rec)
	}
	g.Flush(p.js)
	if err := g.Stored(); err != nil {
		p.indexErrors.Add(1)
		p.logger.Warn("id index write failed; the message cannot be cancelled", slog.Any("error", err))
	}
}

// newGroup returns an index group for the records of stored writes.
func (p *writePipeline) newGroup() *index.Group {
	g := index.NewGroup()
	if p.loseIndex != nil {
		g.LoseAnswers(p.loseIndex)
	}
	return g
}

// sent queues rt, whose write was sent (rt.fut, a [jswire.PubAcks] future), for the acker.
func (p *writePipeline) sent(rt *routing) {
	p.pending.Add(1)
	p.inflightN.Add(1)
	p.toAcker <- ackItem{rt: rt}
}

// reportTail queues a tail report for the acker, behind every write queued
// so far.
func (p *writePipeline) reportTail(stream string, seq uint64) {
	p.toAcker <- ackItem{stream: stream, seq: seq}
}

// drain waits until every write sent is settled.
func (p *writePipeline) drain() { p.pending.Wait() }

// idle reports whether no write is in flight and none failed. (In flight is
// read first: the confirmer records a failure before it settles the write.)
func (p *writePipeline) idle() bool { return p.inflightN.Load() == 0 && !p.retry.broken.Load() }

// acker takes the writes in order and waits for each one's outcome. It
// packs the records of the stored ones into an index group, starts the
// group's writes and hands the batch to the confirmer when groupMax wait, or when the next outcome is not
// known yet and the confirmer has no group left to settle (so groups grow
// while the index writes are slow, and a lone write costs one index write).
func (p *writePipeline) acker(in <-chan ackItem, done chan<- struct{}) {
	defer close(done)
	batches := make(chan ackBatch, 1)
	confirmed := make(chan struct{})
	go func() {
		defer close(confirmed)
		p.confirm.run(batches)
	}()
	var (
		b      ackBatch
		cur    *ackItem // taken from in, its outcome not known yet
		closed bool     // in is closed and empty
	)
	handOff := func() {
		if b.group != nil {
			b.group.Flush(p.js)
		}
		p.groupsOut.Add(1)
		batches <- b // the confirmer waits for nothing of the acker's
		b = ackBatch{}
	}
	take := func(it ackItem, ok bool) {
		if !ok {
			closed = true
			return
		}
		cur = &it
	}
	add := func() {
		it := *cur
		cur = nil
		if it.ack != nil && it.rt.nRecords > 0 {
			if b.group == nil {
				b.group = p.newGroup()
			}
			for _, rec := range it.rt.records[:it.rt.nRecords] {
				b.group.Add(rec)
			}
		}
		b.items = append(b.items, it)
		if len(b.items) >= p.groupMax {
			handOff()
		}
	}
	for {
		if cur == nil && !closed {
			select {
			case it, ok := <-in:
				take(it, ok)
			default:
			}
		}
		if cur != nil && cur.resolve() {
			add()
			continue
		}
		// Nothing more is known now.
		if len(b.items) > 0 && ((closed && cur == nil) || p.groupsOut.Load() == 0) {
			handOff()
			continue
		}
		if closed && cur == nil {
			break
		}
		var (
			inCh   <-chan ackItem
			doneCh <-chan struct{}
			settle <-chan struct{}
		)
		if cur == nil {
			inCh = in
		} else {
			doneCh = cur.rt.fut.Done()
		}
		if len(b.items) > 0 {
			settle = p.settled
		}
		select {
		case it, ok := <-inCh:
			take(it, ok)
		case <-doneCh:
			cur.ack, cur.rt.err = cur.rt.fut.Result()
			add()
		case <-settle:
		}
	}
	close(batches)
	<-confirmed
}

// resolve reports whether the outcome of it is known now, without waiting, and
// records it (the PubAck, or the write's error in it.rt.err). A tail report
// is known.
func (it *ackItem) resolve() bool {
	if it.rt == nil {
		return true
	}
	select {
	case <-it.rt.fut.Done():
		it.ack, it.rt.err = it.rt.fut.Result()
		return true
	default:
		return false
	}
}

// confirmer is the write pipeline's last stage, on a goroutine of its
// own that the acker starts per session and waits for: it waits for each
// batch's index group to be stored, reports the batch's items to the sink
// in order, and settles them in its pipeline's counters (pending,
// inflightN, groupsOut, settled, indexErrors), which the submitting
// goroutine and the acker read. The sink's methods run on its goroutine;
// a write they find refused goes to the pipeline's retryQueue.
type confirmer struct {
	sink   ackSink
	logger *slog.Logger
	p      *writePipeline // whose writes it settles
}

// run waits for each batch's index group to be stored and reports its
// items to the sink, in order, until batches is closed.
func (c *confirmer) run(batches <-chan ackBatch) {
	p := c.p
	for b := range batches {
		var err error
		if b.group != nil {
			err = b.group.Stored()
		}
		failed := 0
		for _, it := range b.items {
			rt := it.rt
			switch {
			case rt == nil:
				c.sink.tailSynced(it.stream, it.seq)
				continue
			case it.ack == nil:
				c.sink.writeRefused(rt)
			default:
				if err != nil && rt.nRecords > 0 {
					failed++
				}
				c.sink.writeConfirmed(rt, it.ack)
			}
			p.inflightN.Add(-1)
			p.pending.Done()
		}
		if failed > 0 {
			p.indexErrors.Add(uint64(failed))
			c.logger.Warn("id index write failed; the messages cannot be cancelled", slog.Int("messages", failed), slog.Any("error", err))
		}
		p.groupsOut.Add(-1)
		select {
		case p.settled <- struct{}{}:
		default:
		}
	}
}

// retryQueue holds the pipeline's failed writes until the submitting
// goroutine retries them (Router.retryFailed). Shared, guarded by its own
// lock: the confirmer adds the writes the server refused (through the
// sink), the submitting goroutine adds those that failed before they were
// sent, and takes them to retry.
type retryQueue struct {
	kick chan<- struct{} // the pipeline's: wakes the submitting goroutine

	mu     sync.Mutex
	failed []*routing // writes to retry, in no particular order
	broken atomic.Bool
}

// fail records rt's write as failed, to be retried, and wakes the
// submitting goroutine.
func (q *retryQueue) fail(rt *routing) {
	q.mu.Lock()
	q.failed = append(q.failed, rt)
	q.mu.Unlock()
	q.broken.Store(true)
	nudge(q.kick)
}

// nudge wakes the submitting goroutine (its pull, or its wait for held
// messages' levels) through kick, the pipeline's kick channel, without
// waiting: kick holds one wake, and one already pending is enough. The
// confirmer (a failed write), the sync helpers (a report) and the
// progress ticker send on it directly; none calls the pipeline.
func nudge(kick chan<- struct{}) {
	select {
	case kick <- struct{}{}:
	default:
	}
}

// failedWrites returns the failed writes, leaving them to be retried.
func (q *retryQueue) failedWrites() []*routing {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.failed)
}

// takeFailed returns the failed writes and clears the broken state.
func (q *retryQueue) takeFailed() []*routing {
	q.mu.Lock()
	defer q.mu.Unlock()
	failed := q.failed
	q.failed = nil
	q.broken.Store(false)
	return failed
}

// requeue puts rts back, ahead of any failed since, to be retried.
func (q *retryQueue) requeue(rts []*routing) {
	q.mu.Lock()
	q.failed = append(rts, q.failed...)
	q.mu.Unlock()
	q.broken.Store(true)
}
