package routing

import (
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
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

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

	records  [2]index.Record // the placement's records: by id, and by merge key if any
	nRecords int
}

func (rt *routing) ack() { _ = rt.msg.Respond(jswire.AckAck) }

func (rt *routing) inProgress() { _ = rt.msg.Respond(jswire.AckProgress) }

// route classifies one ingress message (meta: its $JS.ACK metadata) and
// starts its write.
func (r *Router) route(ctx context.Context, m *nats.Msg, meta jswire.AckMeta) {
	rt := &routing{msg: m, seq: meta.StreamSeq}
	hop := checkHop(r.deps.HopKey, m.Subject, m.Header)
	p, err := r.classifier.classify(m.Subject, m.Header, meta.Stored, hop)
	if p.Clamped {
		r.stats.clamped.Add(1)
		r.logger.Warn("delay level above the table, clamped to the highest level",
			slog.String("value", strings.TrimSpace(headerFold(m.Header, contract.HeaderLevel))), slog.String("delay_level", p.Level.Name()), slog.String("subject", m.Subject))
	}
	if err != nil {
		rt.invalid = true
		r.deadLetterInvalid(rt, err)
		return
	}
	partKey := headerFold(m.Header, contract.HeaderPartitionKey)
	w := r.writerFor(p, partKey)
	if !w.ready || len(w.held) > 0 {
		r.hold(w, heldMsg{m: m, meta: meta, p: p, hop: hop, partKey: partKey})
		return
	}
	r.place(ctx, rt, w, heldMsg{m: m, meta: meta, p: p, hop: hop, partKey: partKey})
}

// place starts the level write of rt (h: its classification) to w, a
// level stream synced in this session, or acks it if w holds it already.
func (r *Router) place(ctx context.Context, rt *routing, w *levelWriter, h heldMsg) {
	m, meta, p, hop, partKey := h.m, h.meta, h.p, h.hop, h.partKey
	if rt.seq <= w.lastRouted.Load() {
		r.stats.skipped.Add(1)
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
			r.stats.merged.Add(1)
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
		rt.out.Header[message.HdrPartKey] = []string{partKey} // a hop keeps it (forward)
	}
	rt.setRecords(w.stream, p, due)
	r.submit(rt)
}

// writerFor returns the level writer of placement p: for a partitioned
// level, partition [levels.PartitionOf] of the partition key, key if it is
// not "" (a Delay-Partition-Key), else the target subject. One key thus
// always goes to one partition stream, which has one writer and is
// delivered in order: the key's order holds.
func (r *Router) writerFor(p placement, key string) *levelWriter {
	parts := r.writers.byNumber[p.Level.Index]
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

// setRecords sets the index records of rt's placement in stream (its sequence
// is set when the write is sent): by id (the publisher's, else the first
// ingress sequence) and by merge key.
func (rt *routing) setRecords(stream string, p placement, due time.Time) {
	_, hops := rt.out.Header[message.HdrHopDue]
	rt.records[0] = index.Record{Key: message.LevelKey(rt.out.Header), Stream: stream, Hop: hops, Due: due, Target: p.Target}
	rt.nRecords = 1
	if p.Merge != "" {
		rt.records[1] = index.Record{Key: index.MergeKey(p.Target, p.Merge), Stream: stream, Hop: hops, Due: due, Target: p.Target}
		rt.nRecords = 2
	}
}

// submit sends the level write of rt.
func (r *Router) submit(rt *routing) {
	w := rt.w
	rt.out.Header[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(w.expected, 10)}
	fut, err := r.run.acks.Publish(rt.out)
	if err != nil {
		rt.err = err
		if errors.Is(err, nats.ErrMaxPayload) {
			// Refused before it was sent: nothing to resync, order is kept.
			// A hop's earlier placement is still its latest index
			// record: record that it left delayd.
			r.writeRecords(rt, "", 0)
			r.deadLetterInvalid(rt, fmt.Errorf("%w: %d payload bytes plus delayd's headers exceed the server's max payload", message.ErrTooLarge, len(rt.out.Data)))
			return
		}
		r.fail(rt)
		return
	}
	w.expected++
	w.lastSubmitted = rt.seq
	rt.fut = fut
	r.writeRecords(rt, w.stream, w.expected)
	r.pipe.sent(rt)
}

// writeRecords places the index records of rt's write at (stream, seq) (the
// pipeline writes them once the write is stored), and adds its merge key's
// placement to the merge cache as in flight.
func (r *Router) writeRecords(rt *routing, stream string, seq uint64) {
	r.pipe.addRecords(rt, stream, seq)
	for _, rec := range rt.records[:rt.nRecords] {
		if index.IsMergeKey(rec.Key) {
			r.merges.submitted(rec)
		}
	}
}

// confirmMerges moves rt's merge placement from in flight to the cache once
// its level write is confirmed (ok), or forgets it when the write failed.
func (r *Router) confirmMerges(rt *routing, ok bool) {
	for _, rec := range rt.records[:rt.nRecords] {
		if index.IsMergeKey(rec.Key) {
			r.merges.confirmed(rec, ok)
		}
	}
}
