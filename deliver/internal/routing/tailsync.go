package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// tailSync reads one level stream's tail, its newest epoch marker, and
// re-indexes it: what a session's helper goroutine does for its level
// stream (syncLevel), and what the router's goroutine does for a ready
// level stream after a failed write (syncTail, checkMarker). Each value is
// used by one goroutine only: [Router.tailSync] copies into it, on the
// router's goroutine, what the reads need of the router, so a helper
// touches no Router field. It changes nothing of w's but its failure clock
// (atomic); the merge cache it remembers re-indexed merge keys in is shared,
// guarded by its own lock (mergecache.go).
type tailSync struct {
	w *levelWriter

	js         jetstream.JetStream
	lookupConn *nats.Conn                // reads the re-index (Wiring.LookupConn, else js's)
	hook       func(stream string) error // tests: called before each tail read (SetTailHook)
	logger     *slog.Logger

	epoch     uint64 // the router's term's epoch (0 on its own: no markers)
	lease     string // the router's lease key, as its markers carry it
	ingressID string // the session's ingress stream's life (Router.ingressRef)
	replicas  int    // for a level stream recreated (Config.Replicas)

	ingress jetstream.StreamState // the ingress stream at the session's start, for the re-index
	window  uint64                // the re-index's window: the ingress messages that can be unacked
	offsets Offsets               // the level streams' committed offsets; nil re-indexes every candidate
	merges  *mergeCache           // shared, lock-guarded: the re-index remembers merge keys in it

	healthEpoch time.Time // the failure clocks' origin (routerHealth.epoch)
}

// tailSync returns w's tail sync for the current session, on the router's
// goroutine.
func (r *Router) tailSync(w *levelWriter) *tailSync {
	return &tailSync{
		w:  w,
		js: r.deps.js, lookupConn: cmp.Or(r.deps.LookupConn, r.deps.js.Conn()), hook: r.run.sync.hook, logger: r.logger,
		epoch: r.run.term.Epoch, lease: r.LeaseKey(), ingressID: r.run.ingressID, replicas: r.cfg.Replicas,
		ingress: r.run.sync.ingress, window: uint64(r.cfg.MaxInFlight + 2*r.cfg.Batch + heldMax),
		offsets: r.deps.Offsets, merges: r.merges,
		healthEpoch: r.health.epoch,
	}
}

// readLevel reads w's tail and re-indexes it, on readers of its own,
// retrying until it can, the router is fenced, or ctx is done.
func (t *tailSync) readLevel(ctx context.Context) (tailState, error) {
	w := t.w
	tails, err := jswire.NewBatchReader(t.js.Conn(), tailBatch)
	if err != nil {
		return tailState{}, err
	}
	defer tails.Close()
	lookups, err := jswire.NewBatchReader(t.lookupConn, index.Batch)
	if err != nil {
		return tailState{}, err
	}
	defer lookups.Close()
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		st, err := t.readTail(ctx, tails)
		if err == nil {
			err = t.reindex(ctx, st, lookups)
		}
		if err == nil || errors.Is(err, errRouterFenced) || ctx.Err() != nil {
			return st, err
		}
		w.failing.fail(t.healthEpoch)
		t.logger.Warn("level stream not synced yet; its messages are held, the other levels route",
			slog.String("stream", w.stream), slog.Any("error", err))
		if !retry.Sleep(ctx) {
			return st, ctx.Err()
		}
	}
}

// readTail reads a level stream's last sequence and the ingress sequence
// of its last message with tails; it changes nothing of w's (the caller
// counts a fence).
func (t *tailSync) readTail(ctx context.Context, tails *jswire.BatchReader) (tailState, error) {
	w := t.w
	var out tailState
	if t.hook != nil {
		if err := t.hook(w.stream); err != nil {
			return out, fmt.Errorf("level stream %s tail: %w", w.stream, err)
		}
	}
	s, err := jswire.StreamInfo(ctx, t.js, w.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted while delayd ran: without it no level could be routed.
		t.logger.Warn("level stream missing; recreating it", slog.String("stream", w.stream))
		if err = resource.EnsureLevelStream(ctx, t.js, w.stream, w.level.Delay, max(t.replicas, 1)); err == nil {
			s, err = t.js.Stream(ctx, w.stream)
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
		if out.own, err = t.readMarker(ctx); err != nil {
			return out, err
		}
		if out.tailRef, out.lastRouted, err = t.lastIngressRef(ctx, tails, w.stream, st); err != nil {
			return out, err
		}
	}
	return out, nil
}

// readMarker reads the newest marker of w's level stream: a newer epoch
// than this router's term fences the router; own reports this term's own
// (a marker whose PubAck was lost is not written twice). A router on its
// own (epoch 0) writes and checks no markers. Epochs are per lease: a
// marker of another router lease (written under another ingress partition
// count, whose routers all stopped before this count started: a shared
// setting) fences nothing, and this term writes its own after it. Any
// goroutine: it changes nothing of w's (the caller counts a fence).
func (t *tailSync) readMarker(ctx context.Context) (own bool, err error) {
	w := t.w
	if t.epoch == 0 {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	h, seq, _, err := jswire.LastOnSubject(rctx, t.js.Conn(), w.stream, w.marker)
	cancel()
	switch {
	case err != nil:
		return false, fmt.Errorf("level stream %s: epoch marker: %w", w.stream, err)
	case h == nil:
		return false, nil
	}
	epoch, ok := markerEpoch(h)
	switch {
	case !ok || markerLease(h) != t.lease:
	case epoch > t.epoch:
		return false, fmt.Errorf("%w: level stream %s holds the epoch marker of term %d at sequence %d, this router's term is %d",
			errRouterFenced, w.stream, epoch, seq, t.epoch)
	case epoch == t.epoch:
		return true, nil
	}
	return false, nil
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
func (t *tailSync) lastIngressRef(ctx context.Context, tails *jswire.BatchReader, stream string, st jetstream.StreamState) (string, uint64, error) {
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
			t.logger.Warn("level stream tail missing; redelivered ingress messages may be written twice", slog.String("stream", stream))
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
					t.logger.Warn("level stream's last messages have no valid ingress reference (not written by delayd); synced to the last one that has",
						slog.String("stream", stream), slog.Uint64("last_seq", st.LastSeq), slog.Uint64("synced_seq", seq))
				}
				if !ok {
					return "", 0, nil // a marker: no router write before it
				}
				if id != t.ingressID {
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
	t.logger.Warn("no message at the end of the level stream has a valid ingress reference; redelivered ingress messages may be written twice",
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
func (t *tailSync) reindex(ctx context.Context, st tailState, lookups *jswire.BatchReader) error {
	w := t.w
	ingress := t.ingress
	if ingress.Msgs == 0 || st.expected == 0 || st.lastRouted < ingress.FirstSeq {
		return nil // the level's last message was acked at ingress
	}
	window := t.window
	g := index.NewGroup()
	n := 0
	var buf []*nats.Msg
	from := uint64(1)
	if st.expected > window {
		from = st.expected - window + 1
	}
	if t.offsets != nil {
		from = max(from, t.offsets.Committed(ctx, w.stream)+1)
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
				t.merges.remember(rec)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	g.Flush(t.js)
	if err := g.Stored(); err != nil {
		return fmt.Errorf("re-index %s: %w", w.stream, err)
	}
	t.logger.Info("re-indexed level messages whose ingress message was not acked", slog.String("stream", w.stream), slog.Int("messages", n))
	return nil
}
