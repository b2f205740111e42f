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

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/hedge"
)

// RunTerm routes for one term of the router lease: until ctx is done (a
// stop, or the term's end) or the router finds its term no longer valid.
// In-flight writes settle on the way out, as in [Router.Run]; the elector
// releases the lease after it returns. The merge cache starts empty: what
// it knew may have changed under another replica's router.
func (r *Router) RunTerm(ctx context.Context, t ownership.Term) error {
	r.run.term = t
	r.run.term.Recovering(true) // until a session has started: not handed over meanwhile
	r.stats.epoch.Store(t.Epoch)
	r.stats.owner.Store(true)
	r.merges.reset()
	for _, w := range r.writers.all {
		w.marked = 0 // each term writes its own marker
	}
	defer func() {
		r.stats.owner.Store(false)
		r.progress() // not routing is not failing: no failure clock runs
		// Every session's pipeline has stopped, its writes confirmed or
		// abandoned: the async publisher's reply subscription and its
		// reconnect listener go with the term (the next term's first
		// async publish makes them again).
		r.deps.js.CleanupPublisher()
	}()
	return r.Run(ctx)
}

// Run routes until ctx is done, then lets in-flight writes finish (or
// abandons them: their ingress messages stay unacked and are routed again,
// without duplicates, on the next start) and returns nil. It survives server
// restarts and reconnects; it returns an error only for a bad setup.
func (r *Router) Run(ctx context.Context) error {
	tails, err := jswire.NewBatchReader(r.deps.js.Conn(), tailBatch)
	if err != nil {
		return err
	}
	defer tails.Close()
	// The tail sync's reads, which any replica answers, are sent again
	// while unanswered: one lost to a hung replica would restart the
	// router's whole start.
	r.run.sync.tails = tails
	lookups, err := jswire.NewBatchReader(cmp.Or(r.deps.LookupConn, r.deps.js.Conn()), index.Batch)
	if err != nil {
		return err
	}
	defer lookups.Close()
	r.run.ids = lookups
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		began := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRouterFenced) {
			// Once per term: the session acked nothing after the
			// refused write, and the term ends here.
			r.logger.Warn("router stopped: a router of a newer term writes the level streams (fenced)", slog.Uint64("epoch", r.run.term.Epoch), slog.Any("error", err))
			return nil
		}
		if !r.run.term.Held() {
			r.logger.Info("router stopped: this replica's lease term ended", slog.Uint64("epoch", r.run.term.Epoch), slog.Any("error", err))
			return nil
		}
		r.health.failing.fail(r.health.epoch)
		r.run.term.Recovering(true)
		if time.Since(began) > time.Minute {
			retry.Reset() // a long healthy session: start the backoff afresh
		}
		r.logger.Warn("router restarting", slog.Any("error", err))
		t := time.NewTimer(restartWait(retry, err))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// restartWait returns how long [Router.Run] waits before its next session
// after one that ended with err: retry's next wait, but at most
// [hedge.AfterLeader] while err is a request nobody answered (a timeout,
// or no responders): a server or leader that hangs, or one being elected.
// The next session's requests reach the new leader once JetStream has
// elected one, and a wait grown over the election (up to 5 s) would only
// delay them. Other errors back off in full.
func restartWait(retry *backoff.Backoff, err error) time.Duration {
	d := retry.Next()
	if hedge.IsTimeout(err) || errors.Is(err, nats.ErrNoResponders) {
		d = min(d, hedge.AfterLeader)
	}
	return d
}

// session runs one ingress consumer from a fresh resync until an error.
func (r *Router) session(ctx context.Context) error {
	// Writes an earlier session (or term) left failed are not retried:
	// their ingress messages are unacked, and this session's fresh
	// consumer delivers them again, in order, to be written (or acked as
	// stored) at their level's tail as this session syncs it. Retried
	// here, a write to a level this session has not synced yet would
	// expect the tail an earlier session knew, plus one for each copy
	// sent since: refused for ever (a live-lock: the level's sync is
	// applied only between retry rounds, which never end), or stored a
	// second time after a copy whose PubAck was lost.
	r.pipe.retry.takeFailed()
	var opened closers
	defer opened.close()
	pull, err := r.open(ctx, &opened)
	if err != nil {
		return err
	}
	return r.consume(ctx, pull)
}

// closers are what a session opened, closed in reverse order when the
// session ends, as defers would be: Run's goroutine only.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c *closers) close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// open starts a session: it checks the term, starts the PubAck tracker
// and the write pipeline, syncs the level streams' tails (re-indexing and
// marking each, sync.go), and creates the term's ingress consumer. What
// it starts is added to opened, which the session closes when it ends.
func (r *Router) open(ctx context.Context, opened *closers) (*jswire.Pull, error) {
	if !r.run.term.Held() {
		return nil, ownership.ErrNotOwner // a stale router recreates no stream and writes no index record
	}
	info, err := jswire.StreamInfo(ctx, r.deps.js, resource.IngressStream)
	if err != nil {
		return nil, fmt.Errorf("ingress stream: %w", err)
	}
	r.run.ingressID = strconv.FormatInt(info.CachedInfo().Created.UnixNano(), 10)
	// The acker runs for the session; stopping it lets every write sent
	// settle (flushing the open index group first), before the PubAck
	// tracker closes.
	acks, err := jswire.NewPubAcks(r.deps.js.Conn(), r.hooks.ackTimeout)
	if err != nil {
		return nil, err
	}
	if r.hooks.loseAcks != nil {
		acks.LoseReplies(r.hooks.loseAcks)
	}
	r.run.acks = acks
	opened.add(acks.Close)
	r.pipe.loseIndex = r.hooks.loseIndex
	r.pipe.start()
	opened.add(r.pipe.stop)
	// Phase 1 of the router's ownership: one router at a time, by lease;
	// it stops at its term's end and checks its term before every level
	// write. A stale router paused between that check and its write (or
	// with writes in flight) could still write: so before its first
	// write to a level stream, a new term's router writes its epoch
	// marker there at the synced tail, and a stale router's write
	// expecting an older last sequence fails; its resync then finds the
	// newer marker and stops it (syncTail). Each level stream is synced
	// and marked on its own (sync.go): one that cannot be read yet holds
	// its own messages only. The ingress consumer is per term too, so a
	// stale router can neither delete the new router's consumer nor ack
	// into it.
	if !r.run.term.Held() {
		return nil, ownership.ErrNotOwner
	}
	opened.add(r.startSyncs(ctx, info.CachedInfo().State))
	if err := r.awaitSyncs(ctx); err != nil {
		return nil, err
	}
	consumer, err := r.resetConsumers(ctx, info)
	if err != nil {
		return nil, err
	}
	var filter string
	if r.share.parts > 1 {
		filter = resource.IngressPartitionSubject(r.share.part) + ">"
	}
	_, err = ingressRequest(ctx, r, "create", func(ctx context.Context) (jetstream.Consumer, error) {
		return r.deps.js.CreateOrUpdateConsumer(ctx, resource.IngressStream, jetstream.ConsumerConfig{
			Durable:       consumer,
			FilterSubject: filter,
			Description:   "delayd router: ingress to level streams",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       ingressAckWait,
			MaxAckPending: r.cfg.MaxInFlight + 2*r.cfg.Batch + heldMax,
			MaxDeliver:    -1,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("create ingress consumer: %w", err)
	}
	pull, err := jswire.NewPull(r.deps.js.Conn(), resource.IngressStream, consumer, r.cfg.Batch, 0)
	if err != nil {
		return nil, err
	}
	// The fresh consumer redelivers every unacked message: dead letters
	// still refused are recorded again when they are.
	r.deps.Refused.Forget(r.share.refusal)
	stop := context.AfterFunc(ctx, pull.Stop)
	opened.add(func() { stop() })
	opened.add(pull.Stop)
	return pull, nil
}

// consume routes what the session's fresh ingress consumer delivers, in
// order, until an error.
func (r *Router) consume(ctx context.Context, pull *jswire.Pull) error {
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
	r.run.term.Recovering(false) // started; Run marks it recovering again if the session ends
	for {
		if r.pipe.retry.broken.Load() {
			if err := r.retryFailed(ctx); err != nil {
				return err
			}
		}
		if err := r.settleSyncs(ctx); err != nil {
			return err
		}
		if r.run.sync.heldBytes > heldMaxBytes {
			// Held messages of levels not synced yet fill their bound:
			// nothing more is pulled until one is synced.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.pipe.kick:
			}
			continue
		}
		m, err := pull.Next(ctx, r.pipe.kick, false, 0)
		if m == nil && err == nil {
			// Nothing waiting. Nothing in flight, failed or held:
			// caught up, which is progress.
			if r.pipe.idle() && r.run.sync.unsynced == 0 {
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
		if !r.run.term.Held() {
			// Checked before each message's level write (a mutex and a
			// monotonic clock read): m stays unacked, for the next owner.
			return ownership.ErrNotOwner
		}
		if r.share.parts > 1 {
			// Stored as "delayd.in.<i>.<target>": routed, indexed and
			// dead-lettered under the subject it was published to.
			if rest, ok := strings.CutPrefix(m.Subject, resource.IngressPartitionSubject(r.share.part)); ok {
				m.Subject = r.cfg.Prefix + "." + rest
			}
		}
		r.route(ctx, m, meta)
	}
}

// errDeliveryLost ends a router session whose ingress consumer skipped a
// delivery number.
var errDeliveryLost = errors.New("ingress delivery lost")
