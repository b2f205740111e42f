package deliver

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
)

// ackSink is what the write pipeline's acker reports to, in ingress order,
// on the acker goroutine. The router implements it.
type ackSink interface {
	// writeConfirmed: rt's write (level or dead letter) is stored as ack
	// says, and its index records are stored or their failure counted.
	writeConfirmed(rt *routing, ack *jetstream.PubAck)
	// writeRefused: rt's write failed with rt.err (set); its index
	// records are settled.
	writeRefused(rt *routing)
	// tailSynced: a level stream's last sequence, read by a tail sync.
	tailSynced(stream string, seq uint64)
}

// writePipeline is the router's ordered write pipeline: level and
// dead-letter writes sent asynchronously, their index records packed into
// index groups, and an acker goroutine confirming them in ingress order.
//
// Two goroutines use it. The submitting goroutine (the router's session)
// calls every method except the [ackSink] ones; the acker goroutine, which
// the pipeline starts per session, confirms writes and calls the sink, and
// may call fail.
//
// The acker waits for a write's index group to be stored, and only the
// submitting goroutine starts a group's writes (flush). The acker therefore
// must never wait for a group that is still open while the submitting
// goroutine waits for room in the acker's queue. The structure rules that
// out: the acker's queue (toAcker) is sent to only by hand, and a write
// whose group is open is held back (held) until that group is flushed;
// flush hands the held writes over after starting the group's writes.
type writePipeline struct {
	js       jetstream.JetStream
	logger   *slog.Logger
	sink     ackSink
	groupMax int // writes held back at most before their group is flushed
	queue    int // the acker queue's capacity

	// Submitting goroutine only.
	group   *index.Group    // the open index group, nil if none
	held    []ackItem       // writes behind the open group, not handed to the acker yet
	toAcker chan<- ackItem  // the acker's queue, sent to only by hand
	done    <-chan struct{} // closed when the acker has returned

	pending   sync.WaitGroup // writes sent and not settled by the acker
	inflightN atomic.Int64   // the same, readable from anywhere
	kick      chan struct{}  // wakes the submitting goroutine when a write failed

	mu     sync.Mutex
	failed []*routing // writes to retry, in no particular order
	broken atomic.Bool

	indexErrors atomic.Uint64 // index groups that failed, per write
}

// ackItem is a write for the acker to confirm, or a tail report.
type ackItem struct {
	rt     *routing
	stream string // a tail report: rt is nil
	seq    uint64
}

// newWritePipeline returns a pipeline for at most maxInFlight writes
// awaiting their PubAck.
func newWritePipeline(js jetstream.JetStream, logger *slog.Logger, sink ackSink, maxInFlight int) *writePipeline {
	// Up to groupMax writes wait for their group, so the acker's queue
	// holds the rest of maxInFlight.
	groupMax := max(1, min(index.GroupMax, maxInFlight/2))
	return &writePipeline{
		js: js, logger: logger, sink: sink, groupMax: groupMax, queue: max(0, maxInFlight-groupMax),
		kick: make(chan struct{}, 1),
	}
}

// start starts the acker for a session.
func (p *writePipeline) start() {
	q := make(chan ackItem, p.queue)
	done := make(chan struct{})
	p.toAcker, p.done = q, done
	go p.acker(q, done)
}

// stop hands every held write to the acker, then waits for the acker to
// settle them all and return.
func (p *writePipeline) stop() {
	p.flush()
	close(p.toAcker)
	<-p.done
}

// addIndex adds the index records of rt's placement at (stream, seq) to the
// open index group. They are stored before the ingress message is acked:
// the group is written when enough writes wait for it, when no ingress
// message is waiting, and before a retry or the end of a session.
func (p *writePipeline) addIndex(rt *routing, stream string, seq uint64) {
	if p.group == nil {
		p.group = index.NewGroup()
	}
	for i := range rt.nIndex {
		rec := &rt.index[i]
		rec.Stream, rec.Seq = stream, seq
		p.group.Add(*rec)
	}
	rt.group = p.group
}

// sent queues rt, whose write was sent (rt.fut), for the acker.
func (p *writePipeline) sent(rt *routing) {
	p.pending.Add(1)
	p.inflightN.Add(1)
	p.enqueue(ackItem{rt: rt})
}

// reportTail queues a tail report for the acker, behind every write queued
// so far.
func (p *writePipeline) reportTail(stream string, seq uint64) {
	p.enqueue(ackItem{stream: stream, seq: seq})
}

func (p *writePipeline) enqueue(it ackItem) {
	if len(p.held) == 0 && (it.rt == nil || it.rt.group == nil || it.rt.group != p.group) {
		p.hand(it) // nothing open ahead of it
		return
	}
	p.held = append(p.held, it)
	if len(p.held) >= p.groupMax {
		p.flush()
	}
}

// flush starts the writes of the open index group, then hands the writes
// held behind it to the acker.
func (p *writePipeline) flush() {
	if p.group != nil {
		p.group.Flush(p.js)
		p.group = nil
	}
	for i, it := range p.held {
		p.hand(it)
		p.held[i] = ackItem{}
	}
	p.held = p.held[:0]
}

// hand gives the acker a write whose index group, if any, is flushed. It
// blocks while the acker's queue is full; the acker never waits for the
// submitting goroutine, so it makes room.
func (p *writePipeline) hand(it ackItem) {
	if it.rt != nil && it.rt.group != nil && it.rt.group == p.group {
		panic("deliver: write handed to the acker before its index group was flushed")
	}
	p.toAcker <- it
}

// drain flushes and waits until every write sent is settled.
func (p *writePipeline) drain() {
	p.flush()
	p.pending.Wait()
}

// idle reports whether no write is in flight and none failed. (In flight is
// read first: the acker records a failure before it settles the write.)
func (p *writePipeline) idle() bool { return p.inflightN.Load() == 0 && !p.broken.Load() }

// acker confirms writes in order.
func (p *writePipeline) acker(in <-chan ackItem, done chan<- struct{}) {
	defer close(done)
	for it := range in {
		rt := it.rt
		if rt == nil {
			p.sink.tailSynced(it.stream, it.seq)
			continue
		}
		select {
		case ack := <-rt.fut.Ok():
			p.settleIndex(rt)
			p.sink.writeConfirmed(rt, ack)
		case err := <-rt.fut.Err():
			rt.err = err
			p.settleIndex(rt) // superseded by the records of the retried write
			p.sink.writeRefused(rt)
		}
		p.inflightN.Add(-1)
		p.pending.Done()
	}
}

// settleIndex waits until rt's index records are stored.
func (p *writePipeline) settleIndex(rt *routing) {
	if rt.group != nil {
		if err := rt.group.Stored(); err != nil {
			p.indexErrors.Add(1)
			p.logger.Warn("id index write failed; the message cannot be cancelled", slog.Any("error", err))
		}
		rt.group = nil
	}
}

// fail records rt's write as failed, to be retried, and wakes the
// submitting goroutine.
func (p *writePipeline) fail(rt *routing) {
	p.mu.Lock()
	p.failed = append(p.failed, rt)
	p.mu.Unlock()
	p.broken.Store(true)
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// takeFailed returns the failed writes and clears the broken state.
func (p *writePipeline) takeFailed() []*routing {
	p.mu.Lock()
	defer p.mu.Unlock()
	failed := p.failed
	p.failed = nil
	p.broken.Store(false)
	return failed
}

// requeue puts rts back, ahead of any failed since, to be retried.
func (p *writePipeline) requeue(rts []*routing) {
	p.mu.Lock()
	p.failed = append(rts, p.failed...)
	p.mu.Unlock()
	p.broken.Store(true)
}
