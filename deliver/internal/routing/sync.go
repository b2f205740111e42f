package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
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
				r.pipe.wake()
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
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res := syncResult{w: w}
		res.tail, res.err = r.readLevel(ctx, w)
		select {
		case s.results <- res: // room for one per level stream: one sync or marker at a time each
			r.pipe.wake()
		case <-ctx.Done():
		}
	}()
}

// readLevel reads w's tail and re-indexes it, on readers of its own,
// retrying until it can, the router is fenced, or ctx is done.
func (r *Router) readLevel(ctx context.Context, w *levelWriter) (tailState, error) {
	tails, err := jswire.NewBatchReader(r.deps.js.Conn(), tailBatch)
	if err != nil {
		return tailState{}, err
	}
	defer tails.Close()
	tails.ResendUnanswered() // see Run
	lookups, err := jswire.NewBatchReader(cmp.Or(r.deps.LookupConn, r.deps.js.Conn()), index.Batch)
	if err != nil {
		return tailState{}, err
	}
	defer lookups.Close()
	lookups.ResendUnanswered() // the re-index reads the level stream, which any replica answers
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		st, err := r.readTail(ctx, w, tails)
		if err == nil {
			err = r.reindex(ctx, w, st, lookups)
		}
		if err == nil || errors.Is(err, errRouterFenced) || ctx.Err() != nil {
			return st, err
		}
		w.failing.fail(r.health.epoch)
		r.logger.Warn("level stream not synced yet; its messages are held, the other levels route",
			slog.String("stream", w.stream), slog.Any("error", err))
		if !retry.Sleep(ctx) {
			return st, ctx.Err()
		}
	}
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
			if r.pipe.broken.Load() {
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
	ctx := s.ctx
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
			r.pipe.wake()
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
	st, err := r.readTail(ctx, w, r.run.sync.tails)
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

// readTail reads a level stream's last sequence and the ingress sequence
// of its last message with tails; it changes nothing of w's (the caller
// counts a fence).
func (r *Router) readTail(ctx context.Context, w *levelWriter, tails *jswire.BatchReader) (tailState, error) {
	var out tailState
	if r.run.sync.hook != nil {
		if err := r.run.sync.hook(w.stream); err != nil {
			return out, fmt.Errorf("level stream %s tail: %w", w.stream, err)
		}
	}
	s, err := jswire.StreamInfo(ctx, r.deps.js, w.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted while delayd ran: without it no level could be routed.
		r.logger.Warn("level stream missing; recreating it", slog.String("stream", w.stream))
		if err = resource.EnsureLevelStream(ctx, r.deps.js, w.stream, w.level.Delay, max(r.cfg.Replicas, 1)); err == nil {
			s, err = r.deps.js.Stream(ctx, w.stream)
		}
	}
	if err != nil {
		return out, fmt.Errorf("level stream %s: %w", w.stream, err)
	}
	st := s.CachedInfo().State
	out.expected = st.LastSeq
	if st.LastSeq > 0 {
		// The newest epoch marker first: a newer router's fences this one
		// before anything it wrote is taken for this router's.
		if out.own, err = r.readMarker(ctx, w); err != nil {
			return out, err
		}
		if out.tailRef, out.lastRouted, err = r.lastIngressRef(ctx, tails, w.stream, st); err != nil {
			return out, err
		}
	}
	return out, nil
}

// Tail sync reads back at most tailWalkBack messages of a level stream,
// tailBatch at a time, for the last one the router wrote.
const (
	tailBatch    = 16
	tailWalkBack = 256
)

// lastIngressRef returns, read with tails, the ingress reference (Delayd-Ingress) of the last
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
func (r *Router) lastIngressRef(ctx context.Context, tails *jswire.BatchReader, stream string, st jetstream.StreamState) (string, uint64, error) {
	var buf []*nats.Msg
	foreign := false // walked back over a message delayd did not write
	first := max(st.FirstSeq, 1)
	for to := st.LastSeq; to >= first && st.LastSeq-to < tailWalkBack; {
		from := first
		if to-first >= tailBatch {
			from = to - tailBatch + 1
		}
		rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		var err error
		buf, err = tails.Read(rctx, stream, buf[:0], from, int(to-from+1), 1<<20)
		cancel()
		if err != nil {
			return "", 0, fmt.Errorf("level stream %s tail: %w", stream, err)
		}
		if to == st.LastSeq && (len(buf) == 0 || buf[len(buf)-1].Header.Get(message.HdrJSSequence) != strconv.FormatUint(st.LastSeq, 10)) {
			r.logger.Warn("level stream tail missing; redelivered ingress messages may be written twice", slog.String("stream", stream))
			return "", 0, nil
		}
		for i := len(buf) - 1; i >= 0; i-- {
			m := buf[i]
			seq, _ := strconv.ParseUint(m.Header.Get(message.HdrJSSequence), 10, 64)
			if seq > to {
				continue // past this read's range (a byte-limited read returns fewer)
			}
			ref, marker := m.Header.Get(message.HdrIngress), isMarkerMsg(m)
			if marker {
				ref = m.Header.Get(message.HdrRouterTail)
			}
			id, ingressSeq, ok := message.ParseIngressRef(ref)
			if ok || marker {
				if foreign {
					r.logger.Warn("level stream's last messages have no valid ingress reference (not written by delayd); synced to the last one that has",
						slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("synced_seq", seq))
				}
				if !ok {
					return "", 0, nil // a marker: no router write before it
				}
				if id != r.run.ingressID {
					return ref, 0, nil // written for an earlier ingress stream
				}
				return ref, ingressSeq, nil
			}
			foreign = true
		}
		if len(buf) == 0 {
			break
		}
		lowest, _ := strconv.ParseUint(buf[0].Header.Get(message.HdrJSSequence), 10, 64)
		if lowest <= first {
			break
		}
		to = lowest - 1
	}
	r.logger.Warn("no message at the end of the level stream has a valid ingress reference; redelivered ingress messages may be written twice",
		slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Int("read_back", tailWalkBack))
	return "", 0, nil
}

// reindex writes the index records of w's level messages whose ingress
// message is not acked yet (st: w's tail as read), with lookups. Their
// records may have been lost: a crash between the level write and the
// index write. Only ingress messages not acked can be such, and only the
// last MaxAckPending of the level stream can hold them; messages the
// level's committed offset has passed are left alone (a cancelled one's
// "cancelled" record must stay the latest).
func (r *Router) reindex(ctx context.Context, w *levelWriter, st tailState, lookups *jswire.BatchReader) error {
	ingress := r.run.sync.ingress
	if ingress.Msgs == 0 || st.expected == 0 || st.lastRouted < ingress.FirstSeq {
		return nil // the level's last message was acked at ingress
	}
	window := uint64(r.cfg.MaxInFlight + 2*r.cfg.Batch + heldMax)
	g := index.NewGroup()
	n := 0
	var buf []*nats.Msg
	from := uint64(1)
	if st.expected > window {
		from = st.expected - window + 1
	}
	if r.deps.Offsets != nil {
		from = max(from, r.deps.Offsets.Committed(ctx, w.stream)+1)
	}
	for from <= st.expected {
		rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		var err error
		buf, err = lookups.Read(rctx, w.stream, buf[:0], from, index.Batch, 1<<20)
		cancel()
		if err != nil {
			return fmt.Errorf("re-index %s: %w", w.stream, err)
		}
		if len(buf) == 0 {
			break
		}
		for _, m := range buf {
			seq, _ := strconv.ParseUint(m.Header.Get(message.HdrJSSequence), 10, 64)
			from = max(from, seq+1)
			_, ing, ok := message.ParseIngressRef(m.Header.Get(message.HdrIngress))
			if !ok || isMarkerMsg(m) || ing < ingress.FirstSeq || seq > st.expected {
				continue
			}
			due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
			_, hop := m.Header[message.HdrHopDue]
			target := strings.TrimPrefix(m.Header.Get(message.HdrJSSubject), w.subject)
			if key := message.LevelKey(m.Header); key != "" {
				g.Add(index.Record{Key: key, Stream: w.stream, Seq: seq, Hop: hop, Due: due, Target: target})
			}
			if mk := m.Header.Get(message.HdrMerge); mk != "" {
				rec := index.Record{Key: index.MergeKey(target, mk), Stream: w.stream, Seq: seq, Hop: hop, Due: due, Target: target}
				g.Add(rec)
				r.merges.remember(rec)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	g.Flush(r.deps.js)
	if err := g.Stored(); err != nil {
		return fmt.Errorf("re-index %s: %w", w.stream, err)
	}
	r.logger.Info("re-indexed level messages whose ingress message was not acked", slog.String("stream", w.stream), slog.Int("messages", n))
	return nil
}
