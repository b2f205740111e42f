package level

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
)

// handoff.go: the hand-off of a due message to its target (publish, a hop
// forward) and its dead letter.

// forward moves a cascading message on: it is published to the ingress
// stream again with Delay-Deliver-At set to its due time, so the router
// places it at the level for what remains. The write is confirmed by its
// PubAck like a delivery to a stream; its Nats-Msg-Id (hop.Key.HopID: first
// id and hop number, keyed by delayd's secret) makes the ingress stream drop
// a repeat after a crash. The message keeps its first id, enqueue time and
// publisher id.
func (s *owner) forward(ctx context.Context, m *nats.Msg, seq uint64, target string, due time.Time) error {
	h := m.Header
	origin := h.Get(message.HdrOrigin)
	if origin == "" {
		origin = h.Get(message.HdrIngress)
	}
	hops, _ := strconv.Atoi(h.Get(message.HdrHops))
	hops++
	buildHop(h, origin, hops, due)
	h[contract.HeaderNatsMsgID] = []string{s.cfg.HopKey.HopID(origin, hops)}
	m.Subject, m.Reply, m.Sub = s.cfg.Prefix+"."+target, "", nil
	s.cfg.HopKey.Sign(m.Subject, h)
	fut, err := s.io.acks.Publish(m)
	if err != nil {
		return s.sendFailed(ctx, m, seq, "forward", "the cascading message", err)
	}
	s.stats.forwarded.Add(1)
	s.conf.win.add(delivery{seq: seq, target: m.Subject, fut: fut, hop: true})
	return nil
}

// buildHop rewrites h, a level message's headers, into those of the
// message that re-enters ingress due at due, to be placed again by the
// router and trusted once signed: the internal headers removed but the
// publisher id, merge key, partition key and move count (Delayd-Moves),
// which are kept;
// Delay-Deliver-At set to due, Delay-Enqueued-At kept, origin (the first
// ingress reference) and hops set. A cascade's forward and a move
// (docs/pending.md#22-the-writes-in-order, step 5) both use it; the caller
// sets Nats-Msg-Id and signs.
func buildHop(h nats.Header, origin string, hops int, due time.Time) {
	userID, enqueued, merge, partKey := h.Get(message.HdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(message.HdrMerge), h.Get(message.HdrPartKey)
	moves := h.Get(message.HdrMoves)
	message.StripInternal(h)
	delete(h, contract.HeaderDueAt)
	h[contract.HeaderDeliverAt] = []string{contract.FormatTime(due)}
	h[contract.HeaderEnqueuedAt] = []string{enqueued}
	h[message.HdrOrigin] = []string{origin}
	h[message.HdrHops] = []string{strconv.Itoa(hops)}
	if userID != "" {
		h[message.HdrMsgID] = []string{userID}
	}
	if merge != "" {
		h[message.HdrMerge] = []string{merge}
	}
	if partKey != "" {
		h[contract.HeaderPartitionKey] = []string{partKey}
	}
	if moves != "" {
		h[message.HdrMoves] = []string{moves}
	}
}

// publish hands one message to its target: a JetStream publish if bound to
// a stream, else a core publish.
func (s *owner) publish(ctx context.Context, m *nats.Msg, seq uint64, target string, bound bool) error {
	s.deliveryHeaders(m.Header)
	m.Subject, m.Reply, m.Sub = target, "", nil
	d := delivery{seq: seq, target: target}
	var err error
	if bound {
		d.fut, err = s.io.acks.Publish(m)
	} else {
		if !s.conf.coreUnflushed {
			// The first core publish since the last flush: the connection
			// it goes out on, by its reconnect count.
			s.conf.coreUnflushed, s.conf.coreReconnects = true, s.deps.nc.Stats().Reconnects
		}
		err = s.deps.nc.PublishMsg(m)
	}
	if err != nil {
		return s.sendFailed(ctx, m, seq, "publish", "the delivery", err)
	}
	s.conf.win.add(d)
	return nil
}

// sendFailed handles a hand-off (op: "publish" or "forward") whose message,
// seq, was not sent: the publish call failed. A message over the server's
// max payload (what names it in the dead letter's reason) will never be
// sent: what precedes it is confirmed, then it is dead-lettered, unless an
// earlier delivery failed (it is then read again). Otherwise it is rewound so
// it is read and tried again: it stays the due head (probing) until it is
// handed off, and the error is returned. m.Subject is where it was sent.
func (s *owner) sendFailed(ctx context.Context, m *nats.Msg, seq uint64, op, what string, err error) error {
	if errors.Is(err, nats.ErrMaxPayload) {
		// Refused before sending: confirm what precedes it, then dead-letter.
		s.confirmAll(ctx)
		if s.pos.next != seq+1 {
			return nil // an earlier delivery failed; this one is read again
		}
		s.deadLetterUndeliverable(ctx, m, seq, fmt.Errorf("%w: %s exceeds the server's max payload", message.ErrTooLarge, what))
		return nil
	}
	// Not sent: rewind so it is read and tried again. It stays the
	// due head (probing) until it is handed off.
	s.pos.next, s.head.msg, s.head.resetFeed, s.conf.win.probing = seq, nil, true, true
	return fmt.Errorf("%s to %q: %w", op, m.Subject, err)
}

// deliveryHeaders turns a level message's headers into those its target
// receives (docs/guide.md#what-the-target-receives): the internal headers
// removed, Nats-Msg-Id set to the publisher's id or, without one, to the
// delivery id derived from the first ingress reference, Delay-Hops set
// to the hops a cascading message made, and Delay-Rescheduled to the
// times a rescheduled message was moved (its Delayd-Moves).
//
// It allocates nothing for a message with a publisher id, and only the
// derived id's string otherwise: each value set is the slice of the
// internal header it comes from (the client decodes every header into a
// slice of its own), moved to its new key before that header is removed.
func (s *owner) deliveryHeaders(h nats.Header) {
	id := h[message.HdrMsgID]
	if len(id) == 0 || id[0] == "" {
		// No publisher id: derived from the first ingress reference, made
		// unguessable.
		id = h[message.HdrOrigin]
		if len(id) == 0 || id[0] == "" {
			id = h[message.HdrIngress]
		}
		if len(id) > 0 && id[0] != "" {
			if s.io.idMAC == nil {
				s.io.idMAC = s.cfg.HopKey.NewIDMAC()
			}
			id[0] = s.io.idMAC.DeliveryID(id[0])
		}
	}
	hops, moves := h[message.HdrHops], h[message.HdrMoves]
	message.StripInternal(h)
	if len(id) > 0 && id[0] != "" {
		h[contract.HeaderNatsMsgID] = id[:1]
	}
	if len(hops) > 0 && hops[0] != "" && hops[0] != "0" { // "0": moved, never cascaded
		h[contract.HeaderHops] = hops[:1]
	}
	if len(moves) > 0 && moves[0] != "" {
		h[contract.HeaderRescheduled] = moves[:1]
	}
}

// deadLetterUndeliverable writes a level message that cannot be delivered to DELAYD_DLQ,
// retrying until it is stored, and then counts it as confirmed so the offset
// moves past it in order. m is either as read from the level stream or
// already prepared for delivery.
func (s *owner) deadLetterUndeliverable(ctx context.Context, m *nats.Msg, seq uint64, reason error) {
	id := m.Header.Get(message.HdrIngress)
	if id == "" {
		id = m.Header.Get(contract.HeaderNatsMsgID) // already prepared for delivery
	}
	subject := strings.TrimPrefix(m.Header.Get(message.HdrJSSubject), s.cfg.subject)
	if subject == "" {
		subject = m.Subject
	}
	_, hopping := m.Header[message.HdrHopDue]
	hopping = hopping || m.Header.Get(contract.HeaderDeliverAt) != "" // prepared to move on (forward)
	key, merge := message.LevelKey(m.Header), m.Header.Get(message.HdrMerge)
	dl := message.DeadLetterMsg(subject, m.Header, m.Data, reason, id)
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		// Each attempt finishes even when ctx ends (a stop), bounded by
		// jswire.OpTimeout in message.PublishDeadLetter; ctx ends the retries below.
		err := message.PublishDeadLetter(context.WithoutCancel(ctx), s.deps.js, dl)
		if err == nil {
			s.cfg.Refused.Stored(s.cfg.Stream)
			break
		}
		// Nothing passes it until its dead letter is stored: the level
		// waits (and reports itself stalled), the other levels go on.
		logLevel := slog.LevelError // the first refusal; its retries at debug
		if !s.cfg.Refused.Refused(s.cfg.Stream, err) {
			logLevel = slog.LevelDebug
		}
		s.logger.Log(ctx, logLevel, "dead-letter write failed; retrying", slog.Uint64("seq", seq), slog.Any("error", err))
		if !retry.Sleep(ctx) {
			s.cfg.Refused.Stored(s.cfg.Stream) // not waiting any more: read again at the next load
			// Stopping: the message stays past the offset and is read,
			// and dead-lettered, again on the next load.
			s.pos.next, s.head.msg, s.head.resetFeed = min(s.pos.next, seq), nil, true
			return
		}
	}
	if hopping {
		// Its index record still says it moves on: say it left delayd, so a
		// cancel answers "not found" and its merge key is free.
		s.leftDelayd(key, merge, strings.TrimPrefix(subject, s.cfg.Prefix+"."))
	}
	s.logger.Warn("dead-lettered undeliverable message", slog.String("target", subject), slog.Uint64("seq", seq), slog.String("error", reason.Error()))
	s.stats.deadLettered.Add(1)
	s.cfg.Reasons.Add(message.ReasonOf(reason))
	s.pos.next = max(s.pos.next, seq+1)
	s.view.passed.Store(max(s.view.passed.Load(), seq))
	s.conf.win.passOver(seq)
	s.confirmAll(ctx)
}

// leftDelayd writes "left delayd" index records (no placement) for a
// message's id key and merge key, and frees the merge key in the router.
func (s *owner) leftDelayd(key, merge, target string) {
	recs := []index.Record{{Key: key, Target: target}}
	if merge != "" {
		recs = append(recs, index.Record{Key: index.MergeKey(target, merge), Target: target})
	}
	// Written even when ctx ends: the message did leave delayd. A group,
	// whose copies are sent again every jswire.WriteAttempt within
	// jswire.OpTimeout: the scanner waits for it, and DELAYD_INDEX's leader
	// may hang.
	g := index.NewGroup()
	n := 0
	for _, rec := range recs {
		if rec.Key != "" {
			g.Add(rec)
			n++
		}
	}
	if n > 0 {
		g.Flush(s.deps.js)
		if err := g.Stored(); err != nil {
			s.logger.Warn("id index write failed", slog.Any("error", err))
		}
	}
	for _, rec := range recs {
		if rec.Key != "" && index.IsMergeKey(rec.Key) && s.cfg.MergeGone != nil {
			s.cfg.MergeGone(rec)
		}
	}
}
