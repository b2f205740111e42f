package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// writeConfirmed is the confirmer's report of a stored write ([ackSink]).
func (r *Router) writeConfirmed(rt *routing, ack *jetstream.PubAck) {
	r.confirmMerges(rt, true)
	// Counted before the ack: once the ingress stream no longer holds the
	// message, its count is in [Router.Stats].
	if rt.w == nil {
		r.stats.deadLettered.Add(1)
		r.deps.Reasons.Add(message.ReasonOf(rt.reason))
	} else {
		r.stats.routed.Add(1)
	}
	rt.ack()
	r.health.failing.progress() // the session works
	if rt.w == nil {
		r.deps.Refused.Stored(r.share.refusal + r.ingressRef(rt.seq))
		return
	}
	rt.w.failing.progress()
	rt.w.lastRouted.Store(rt.seq)
	r.deps.Tails.Written(rt.w.stream, ack.Sequence)
}

// writeRefused is the confirmer's report of a failed write ([ackSink]).
func (r *Router) writeRefused(rt *routing) {
	r.confirmMerges(rt, false)
	if rt.invalid {
		r.deferDeadLetter(rt)
		return
	}
	r.fail(rt)
}

// tailSynced is the confirmer's report of a tail sync ([ackSink]).
func (r *Router) tailSynced(stream string, seq uint64) { r.deps.Tails.Written(stream, seq) }

// deadLetterInvalid sends the write of an ingress message that cannot be
// placed (invalid, or too large for a level stream) to DELAYD_DLQ; the
// level owner's dead letters are undeliverable ones.
func (r *Router) deadLetterInvalid(rt *routing, reason error) {
	m := rt.msg
	// Once per message: a redelivery (its dead letter was refused) logs at debug.
	logLevel := slog.LevelWarn
	if meta, ok := jswire.ParseAck(m.Reply); ok && meta.Delivered > 1 {
		logLevel = slog.LevelDebug
	}
	r.logger.Log(context.Background(), logLevel, "dead-lettering invalid message", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	rt.w, rt.reason = nil, reason
	rt.out = message.DeadLetterMsg(m.Subject, maps.Clone(m.Header), m.Data, reason, r.ingressRef(rt.seq))
	fut, err := r.run.acks.Publish(rt.out)
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

// deferDeadLetter leaves an invalid message whose dead letter DELAYD_DLQ
// refused in the ingress stream, unacked: it is negatively acknowledged with
// a delay (capped backoff by its delivery count), so the ingress consumer
// delivers it again and its dead letter is tried again, deduped at
// DELAYD_DLQ by its Nats-Msg-Id (the ingress reference). It goes to no level
// stream, so routing the messages behind it keeps every level stream in
// ingress order. Nothing is acked before its dead letter is stored.
func (r *Router) deferDeadLetter(rt *routing) {
	first := r.deps.Refused.Refused(r.share.refusal+r.ingressRef(rt.seq), rt.err)
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
		rt.w.failing.fail(r.health.epoch)
	} else {
		r.health.failing.fail(r.health.epoch)
	}
	r.pipe.retry.fail(rt)
}

// retryFailed redoes failed writes in ingress order after every in-flight
// write has settled, so each level stream stays in strict ingress order. A
// write the server refuses for good (too large once delayd's headers are
// added) is dead-lettered; any other failure is retried, with capped
// backoff, until it is stored or ctx is done.
func (r *Router) retryFailed(ctx context.Context) error {
	retry := backoff.New(50*time.Millisecond, 5*time.Second)
	// The failure clocks run from the first failure (fail) until a write is
	// confirmed: a retry round, even one whose writes are all sent, is not
	// progress (they may fail again in the acker).
	for round := 0; ; round++ {
		r.pipe.drain()
		if !r.run.term.Held() {
			r.noteFenced(ctx)
			return ownership.ErrNotOwner // the failed writes stay unacked, for the next owner
		}
		failed := r.pipe.retry.takeFailed()
		if len(failed) == 0 {
			return nil
		}
		slices.SortFunc(failed, func(a, b *routing) int { return compareUint(a.seq, b.seq) })
		for _, rt := range failed {
			if rt.w != nil && !rt.w.ready {
				// Not reached: a session retries only its own writes
				// (session drops an earlier one's), which went to levels
				// it synced. A level not synced in this session is not
				// resynced below, so its write would expect a stale tail:
				// the session ends instead, and the next one's consumer
				// delivers the message again.
				r.pipe.retry.requeue(failed)
				return fmt.Errorf("level stream %s: a failed write to retry, the level not synced in this session", rt.w.stream)
			}
		}
		for _, rt := range failed {
			rt.inProgress() // keep the ack wait from redelivering them meanwhile
		}
		r.logger.Warn("level writes failed; retrying in order", slog.Int("count", len(failed)), slog.Any("error", failed[0].err))
		if round > 0 && !retry.Sleep(ctx) {
			r.pipe.retry.requeue(failed)
			return ctx.Err()
		}
		submitted := make([]uint64, len(r.writers.all))
		for i, w := range r.writers.all {
			submitted[i] = w.lastSubmitted // a level not synced yet is not resynced (syncTails)
		}
		if err := r.syncTails(ctx); err != nil {
			r.pipe.retry.requeue(failed)
			return err
		}
		if err := r.checkTails(submitted); err != nil {
			r.pipe.retry.requeue(failed)
			return err
		}
		if !r.run.term.Held() {
			// Checked again after the resync's reads: a router paused
			// before them may have read a newer router's tail, and must
			// not write at it. Held now, the tails it read were read
			// before any newer term began, whose markers then refuse
			// every write expecting them.
			r.pipe.retry.requeue(failed)
			r.noteFenced(ctx)
			return ownership.ErrNotOwner
		}
		for i, rt := range failed {
			if r.pipe.retry.broken.Load() {
				// A write failed before it was sent; submitting later
				// messages of its level now would break ingress order.
				r.pipe.retry.requeue(failed[i:])
				break
			}
			if rt.w == nil || message.TooLarge(rt.err) {
				// A dead letter of a message placed in a level's order, or
				// a level write refused for its size: nothing of its level
				// behind it may be written before it is stored.
				w := rt.w
				if err := r.deadLetterSync(ctx, rt); err != nil {
					logLevel := slog.LevelWarn // the first refusal; its retries at debug
					if !r.deps.Refused.Refused(r.share.refusal+r.ingressRef(rt.seq), err) {
						logLevel = slog.LevelDebug
					}
					r.logger.Log(ctx, logLevel, "dead-letter write failed; retrying", slog.Uint64("ingress_seq", rt.seq), slog.Any("error", err))
					r.pipe.retry.requeue(failed[i:])
					break
				}
				r.deps.Refused.Stored(r.share.refusal + r.ingressRef(rt.seq))
				r.health.failing.progress()
				if w != nil {
					w.failing.progress()
				}
				continue
			}
			if rt.seq <= rt.w.lastRouted.Load() {
				r.stats.skipped.Add(1)
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
// end may have cancelled it), each read bounded by jswire.OpTimeout.
func (r *Router) noteFenced(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	checked := make(map[*levelWriter]bool)
	for _, rt := range r.pipe.retry.failedWrites() {
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
	if r.run.term.Epoch == 0 {
		return nil
	}
	for i, w := range r.writers.all {
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
		reason = fmt.Errorf("%w: the level-stream write was refused: %v", message.ErrTooLarge, rt.err)
		rt.reason = reason
		rt.out = message.DeadLetterMsg(m.Subject, maps.Clone(m.Header), m.Data, reason, r.ingressRef(rt.seq))
		r.logger.Warn("dead-lettering message too large for its level stream", slog.String("subject", m.Subject), slog.Uint64("ingress_seq", rt.seq), slog.String("error", reason.Error()))
	}
	if err := message.PublishDeadLetter(ctx, r.deps.js, rt.out); err != nil {
		return err
	}
	if rt.nRecords > 0 {
		// Its write was never stored (a level write refused for its size,
		// or a dead letter whose own write failed: rt.w is nil then), so
		// none of its records was written; a hop's earlier placement is
		// still its latest record, and its merge key is in flight: record
		// that it left delayd, and confirm the merge key.
		r.writeRecords(rt, "", 0)
		r.pipe.storeRecords(rt)
		r.confirmMerges(rt, true)
	}
	r.stats.deadLettered.Add(1)
	r.deps.Reasons.Add(message.ReasonOf(reason))
	rt.w = nil
	rt.ack()
	return nil
}

// ingressRef is the derived id of an ingress message: unique across the
// ingress stream's lives because it includes the stream's creation time.
func (r *Router) ingressRef(seq uint64) string {
	return "delayd-" + r.run.ingressID + "-" + strconv.FormatUint(seq, 10)
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
