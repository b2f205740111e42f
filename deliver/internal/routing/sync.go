package routing

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/hedge"
)

// A router session syncs each level stream on its own
// (docs/design.md#the-routers-start-level-by-level): a helper
// goroutine per level stream reads its tail (and re-indexes it), retrying
// until it can; the router's goroutine then writes the level's epoch
// marker, and once it is stored, the level is ready and its held ingress
// messages are placed, in ingress order, before any later one of the
// level. Until then the level's messages are held unacked (kept from
// redelivery by in-progress acks) and the other levels route. Every level
// write, the marker too, is sent from the router's goroutine: each level
// stream keeps one writer.

// Held messages' bounds: their count is added to the ingress consumer's
// MaxAckPending (so held messages do not starve the other levels of
// deliveries until it is reached), and past heldMaxBytes of payload the
// router pulls nothing more until a level is synced.
const (
	heldMax      = 16384
	heldMaxBytes = 64 << 20
)

// levelSync is a session's level syncs and held messages. Run's goroutine
// only, except results and progressDue.
type levelSync struct {
	tails *jswire.BatchReader       // the resync of ready levels after a failed write (Run's goroutine)
	hook  func(stream string) error // tests: called before each tail read of a level; its error fails the read

	ctx         context.Context // the session's, for syncs started later
	results     chan syncResult
	wg          sync.WaitGroup
	ingress     jetstream.StreamState // at the session's start, for the re-index
	progressDue atomic.Bool           // time to keep held messages from redelivery

	unsynced  int // level streams not ready
	heldN     int // held messages
	heldBytes int // their payload bytes
}

// heldMsg is an ingress message classified for a level stream not ready
// yet.
type heldMsg struct {
	m       *nats.Msg
	meta    jswire.AckMeta
	p       placement
	hop     hopCheck
	partKey string
}

// tailState is what a tail sync read of a level stream.
type tailState struct {
	expected   uint64 // its last sequence
	lastRouted uint64 // the ingress sequence of the last router write, if of this ingress life
	tailRef    string // that write's ingress reference
	own        bool   // its newest marker is this term's
}

// syncResult is a helper's report: a tail read, or (marker) the outcome of
// the level's epoch marker write.
type syncResult struct {
	w      *levelWriter
	tail   tailState
	marker bool
	ack    *jetstream.PubAck
	err    error
}

// startSyncs starts every level stream's sync for a session whose ingress
// stream had state ingress at its start, and returns the func that stops
// them and waits for their goroutines.
func (r *Router) startSyncs(ctx context.Context, ingress jetstream.StreamState) func() {
	s := &r.run.sync
	ctx, cancel := context.WithCancel(ctx)
	s.ctx, s.ingress = ctx, ingress
	s.results = make(chan syncResult, len(r.writers.all))
	s.unsynced, s.heldN, s.heldBytes = len(r.writers.all), 0, 0
	for _, w := range r.writers.all {
		w.ready, w.held = false, nil
		r.syncLevel(w)
	}
	kick := r.pipe.kick
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(ingressAckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.progressDue.Store(true)
				nudge(kick)
			}
		}
	}()
	return func() {
		cancel()
		s.wg.Wait()
	}
}

// syncLevel reads w's tail on a helper goroutine, retrying until it can
// or the session ends, and reports it to the router's goroutine.
func (r *Router) syncLevel(w *levelWriter) {
	s := &r.run.sync
	ctx := s.ctx
	t, kick := r.tailSync(w), r.pipe.kick
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res := syncResult{w: w}
		res.tail, res.err = t.readLevel(ctx)
		select {
		case s.results <- res: // room for one per level stream: one sync or marker at a time each
			nudge(kick)
		case <-ctx.Done():
		}
	}()
}

// syncStartWait is how long a session's start waits for its level
// streams to be synced and marked before it creates its ingress consumer:
// long enough for a read sent again once (hedge.AfterLeader), so that
// normally every level is ready before the first message, and a newer
// router's marker fences this one before it touches the ingress
// consumers; a level not ready by then is held.
const syncStartWait = 2 * hedge.AfterLeader

// awaitSyncs applies the syncs' reports until every level stream is ready
// or syncStartWait has passed.
func (r *Router) awaitSyncs(ctx context.Context) error {
	s := &r.run.sync
	t := time.NewTimer(syncStartWait)
	defer t.Stop()
	for s.unsynced > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case res := <-s.results:
			if err := r.applySync(res); err != nil {
				return err
			}
		}
	}
	return nil
}

// settleSyncs applies the syncs' reports, sends held messages their
// in-progress acks when due, and places the held messages of ready level
// streams (unless a write failed: they wait for its retry).
func (r *Router) settleSyncs(ctx context.Context) error {
	s := &r.run.sync
	for done := false; !done; {
		select {
		case res := <-s.results:
			if err := r.applySync(res); err != nil {
				return err
			}
		default:
			done = true
		}
	}
	// A level not synced yet is a recovery: the lease is not handed over
	// meanwhile (the next holder's start would hold it too, and add its
	// start to every other level's).
	r.run.term.Recovering(s.unsynced > 0)
	if s.progressDue.Swap(false) {
		for _, w := range r.writers.all {
			for _, h := range w.held {
				_ = h.m.Respond(jswire.AckProgress)
			}
		}
	}
	for _, w := range r.writers.all {
		for w.ready && len(w.held) > 0 {
			if r.pipe.retry.broken.Load() {
				return nil // retried first; the held stay first in line
			}
			if !r.run.term.Held() {
				return ownership.ErrNotOwner
			}
			h := w.held[0]
			w.held[0] = heldMsg{}
			w.held = w.held[1:]
			s.heldN--
			s.heldBytes -= len(h.m.Data)
			r.place(ctx, &routing{msg: h.m, seq: h.meta.StreamSeq}, w, h)
		}
		if w.ready {
			w.held = nil
		}
	}
	return nil
}

// hold keeps m, for w not ready yet, behind w's other held messages.
func (r *Router) hold(w *levelWriter, h heldMsg) {
	w.held = append(w.held, h)
	r.run.sync.heldN++
	r.run.sync.heldBytes += len(h.m.Data)
}

// applySync applies a sync's report on the router's goroutine: a tail
// read is applied and the level's marker sent; a stored marker makes the
// level ready; a marker not stored syncs the level again.
func (r *Router) applySync(res syncResult) error {
	w := res.w
	if res.marker {
		if res.err != nil {
			r.logger.Warn("epoch marker not stored; syncing the level stream again", slog.String("stream", w.stream), slog.Any("error", res.err))
			r.syncLevel(w)
			return nil
		}
		w.expected, w.marked = res.ack.Sequence, r.run.term.Epoch
		r.pipe.reportTail(w.stream, w.expected)
		r.levelReady(w)
		return nil
	}
	if res.err != nil {
		r.countFence(w, res.err)
		return res.err // fenced
	}
	r.applyTail(w, res.tail)
	if w.expected > 0 {
		r.pipe.reportTail(w.stream, w.expected)
	}
	if r.run.term.Epoch == 0 || w.marked == r.run.term.Epoch {
		r.levelReady(w)
		return nil
	}
	if !r.run.term.Held() {
		return ownership.ErrNotOwner
	}
	fut, err := r.deps.js.PublishMsgAsync(r.markerMsg(w))
	if err != nil {
		r.logger.Warn("epoch marker not sent; syncing the level stream again", slog.String("stream", w.stream), slog.Any("error", err))
		r.syncLevel(w)
		return nil
	}
	s := &r.run.sync
	ctx, kick := s.ctx, r.pipe.kick
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res := syncResult{w: w, marker: true}
		t := time.NewTimer(jswire.OpTimeout)
		defer t.Stop()
		select {
		case res.ack = <-fut.Ok():
		case res.err = <-fut.Err():
			if wrongLastSeq(res.err) {
				res.err = fmt.Errorf("%w (written to since the tail sync)", res.err)
			}
		case <-t.C:
			res.err = fmt.Errorf("no PubAck within %s", jswire.OpTimeout)
		case <-ctx.Done():
			return
		}
		select {
		case s.results <- res:
			nudge(kick)
		case <-ctx.Done():
		}
	}()
	return nil
}

// levelReady marks w ready: its held messages are placed next.
func (r *Router) levelReady(w *levelWriter) {
	w.ready = true
	r.run.sync.unsynced--
	if r.run.sync.unsynced == 0 {
		r.logger.Debug("every level stream synced", slog.Uint64("epoch", r.run.term.Epoch))
	}
}

// syncTails syncs every ready level writer and reports each stream's last
// sequence (Tails): a write whose PubAck was lost is found here, not
// acked. A level not ready yet is being synced by its helper.
func (r *Router) syncTails(ctx context.Context) error {
	for _, w := range r.writers.all {
		if !w.ready {
			continue
		}
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
// its last message, on the router's goroutine.
func (r *Router) syncTail(ctx context.Context, w *levelWriter) error {
	st, err := r.tailSync(w).readTail(ctx, r.run.sync.tails)
	if err != nil {
		r.countFence(w, err)
		return err
	}
	r.applyTail(w, st)
	return nil
}

// applyTail sets w to the tail st read.
func (r *Router) applyTail(w *levelWriter, st tailState) {
	w.expected = st.expected
	w.lastRouted.Store(st.lastRouted)
	w.tailRef = st.tailRef
	if st.own {
		w.marked = r.run.term.Epoch
	}
	w.lastSubmitted = st.lastRouted
}
