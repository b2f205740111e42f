package cancelapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/levels"
)

// Config configures an [API]: the Service's settings and the values it
// runs on.
type Config struct {
	// Conn is the service's connection: the subscriptions and their
	// replies, and the reads when LookupConn is nil. Required.
	Conn *nats.Conn
	// LookupConn, if set, is the connection for the workers' reads of the
	// id index, the kept answers and the level messages (deliver's
	// Config.LookupConn: the server walks the index inline on the
	// reading connection). Optional.
	LookupConn *nats.Conn
	// JS reads DELAYD_INGRESS's info (the routed wait, the ingress life).
	// Required.
	JS jetstream.JetStream
	// LookupShare is the share of one core's time the index lookups may
	// take, in (0, 1] (deliver's Config.CancelLookupShare). Required.
	LookupShare float64
	// HopKey checks the delivered ids ("delayd-<life>-<seq>-<MAC>") a
	// request may name. Required.
	HopKey hop.Key
	// KeepAnswers looks an id the index no longer knows up in
	// DELAYD_ANSWERS; false: kept answers are off.
	KeepAnswers bool
	// Decider asks the owner of a record's level. Required.
	Decider Decider
	// RouterWaiting returns the router's invalid messages waiting for
	// DELAYD_DLQ (they stay in ingress). Required.
	RouterWaiting func() int
	// Cancels and Statuses count the cancel and the status APIs' answers
	// (the Service's, read by its CancelStats and StatusStats). Required.
	Cancels, Statuses *Counts
	// Lists and CancelAlls count the list and the cancel-all APIs' answers
	// by result (the Service's, read by its ListStats and CancelAllStats).
	// Optional: nil counts nothing.
	Lists, CancelAlls *RequestCounts
	// Reschedules counts the reschedule API's answers (the Service's, read
	// by its RescheduleStats). Optional: nil counts nothing.
	Reschedules *RescheduleCounts
	// MaxDelay is the longest delay a reschedule may ask (deliver's
	// Config.MaxDelay, DELAYD_MAX_DELAY); 0 is [contract.MaxDelayDefault].
	MaxDelay time.Duration
	// Prefix is the ingress subject prefix (deliver's Config.Prefix): the
	// list API refuses a target under it. "" is [contract.PrefixDefault].
	Prefix string
	// Levels is the level table (the list API's walk bounds a stream's
	// reads by it). Required for the list API.
	Levels levels.Table
	// Logger is required (the Service's).
	Logger *slog.Logger
	// Hooks are tests' hooks; zero in production.
	Hooks Hooks
}

// Hooks are an API's test hooks: each, if set, runs at one point of its
// work, on the goroutine doing it.
type Hooks struct {
	// Looked runs in DecideID between the index lookup of a cancel's or
	// status request's id and the owner's decision, with the record found.
	Looked func(index.Record)
	// CancelAllCut runs in CancelAll once its cut (the ingress sequence
	// above which messages count as published after the request) is
	// fixed, before the first walk.
	CancelAllCut func(cut uint64)
}

// Decider has the owner of a record's level decide: the one place where
// a cancel meets the level owners (deliver gives it its level.Owners;
// docs/reshape.md#22-the-one-interface-for-other-goroutines).
type Decider interface {
	// Decide has the owner of rec's level decide ask about the message
	// rec places (cancel it, tell its status; [level.Ask]); reader is the
	// asking worker's, for the reads the decision costs. A level stream
	// this replica does not know answers [level.AnswerGone].
	Decide(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ask level.Ask) (level.CancelAnswer, error)
	// Sift has the owner of a level stream tell which of seqs are still
	// pending (the list API's question; [level.Owners.Sift]).
	Sift(ctx context.Context, stream string, seqs []uint64) (level.Sifted, error)
	// Streams returns the level streams this replica knows.
	Streams() []string
}

// Counts counts one request API's answers by kind (the cancel API leaves
// Pending at zero). Safe for concurrent use.
type Counts struct {
	Pending, Cancelled, NotFound, Delivered, Busy atomic.Uint64
}

// RequestCounts counts one request API's answers by result: answered
// (200), refused as sent (400), busy (429), failed (any other error). Safe
// for concurrent use; a nil *RequestCounts counts nothing.
type RequestCounts struct {
	OK, BadRequest, Busy, Failed atomic.Uint64
}

// count counts one answer: err nil is OK, else by its code.
func (c *RequestCounts) count(err error) {
	switch {
	case c == nil:
	case err == nil:
		c.OK.Add(1)
	case errors.Is(err, errBadList), errors.Is(err, errBadCancelAll):
		c.BadRequest.Add(1)
	case errors.Is(err, level.ErrCancelBusy):
		c.Busy.Add(1)
	default:
		c.Failed.Add(1)
	}
}

// API is the cancel and status APIs (docs/guide.md#cancel): the
// subscriptions, the bounded queue, the workers, the routed wait and the
// lookup pacer. New builds it; Subscribe, then Run, serve it.
//
// Its own methods run on two goroutines: Subscribe (and Unsubscribe when
// Run will not run) on the Service's, Run on its component's. The requests
// are served by [worker]s, one value per worker goroutine, and queued by
// the subscriptions' callbacks through plain functions of the queues
// (enqueueList, enqueueCancelAll) (docs/reshape.md, R4 goroutines).
type API struct {
	*env // immutable after New: read by every goroutine of the API

	subs  []*nats.Subscription // set by Subscribe, unsubscribed by Run
	ch    chan queued          // the queue: the subscriptions send, the workers receive
	lists chan queued          // the list API's queue, its own workers'
	// cancelAlls is the cancel-all API's queue, its own worker's.
	cancelAlls chan queued
}

// env is what every goroutine of an [API] reads: New sets it and nothing
// writes it after. The workers reach the routed wait's goroutine through
// a channel (routed), and share the lookup pacer by design (one budget
// paces every lookup; it guards its state with a mutex).
type env struct {
	cfg     Config       // immutable
	logger  *slog.Logger // immutable
	waits   *routedWait  // the routed wait; its goroutine is Run's child
	routed  routedAsk    // the workers' side of waits (a channel into its goroutine)
	lookups *lookupPacer // paces the workers' index lookups; its own mutex
}

// worker serves requests on one worker goroutine: Run makes one value for
// each of its goroutines (cancelWorkers cancel and status workers,
// listWorkers list workers, the cancel-all worker), so that each value's
// methods run on its goroutine only. It reads env and writes nothing of it
// (the answer counters are atomics; the reader is passed in, the
// goroutine's own).
type worker struct{ *env }

// New returns the API of cfg. Nothing touches the server until Subscribe.
func New(cfg Config) *API {
	waits := newRoutedWait(cfg.JS, cfg.RouterWaiting)
	return &API{env: &env{cfg: cfg, logger: cfg.Logger, waits: waits, routed: waits.ask(), lookups: newLookupPacer(cfg.LookupShare)}}
}

// Cancel, DecideID, Reschedule, List and CancelAll serve one request as a worker
// would, on the caller's goroutine with the caller's reader (deliver's
// tests ask them directly).

// Cancel is [worker.Cancel].
func (a *API) Cancel(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time) (string, error) {
	return (&worker{a.env}).Cancel(ctx, reader, id, scope, notAfter)
}

// DecideID is [worker.DecideID].
func (a *API) DecideID(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time, status bool) (level.CancelAnswer, time.Time, error) {
	return (&worker{a.env}).DecideID(ctx, reader, id, scope, notAfter, status)
}

// Reschedule is [worker.Reschedule].
func (a *API) Reschedule(ctx context.Context, reader *jswire.BatchReader, id string, h nats.Header, scope string, notAfter time.Time) (level.CancelAnswer, time.Time, error) {
	return (&worker{a.env}).Reschedule(ctx, reader, id, h, scope, notAfter)
}

// List is [worker.List].
func (a *API) List(ctx context.Context, reader *jswire.BatchReader, target string, data []byte, notAfter time.Time) (contract.PendingReply, error) {
	return (&worker{a.env}).List(ctx, reader, target, data, notAfter)
}

// CancelAll is [worker.CancelAll].
func (a *API) CancelAll(ctx context.Context, reader *jswire.BatchReader, target string, data []byte, deadline time.Time) (contract.CancelAllReply, error) {
	return (&worker{a.env}).CancelAll(ctx, reader, target, data, deadline)
}

// Routed waits until the router has acked every ingress message published
// before the call (caughtUp true), until 25 s have passed (false: not
// known yet, ask again), or until ctx is done (ctx's error); an error
// reading the ingress stream is returned as is. It is the cancel's routed
// wait ([routedAsk.wait]), answered by the goroutine Run runs: before Run
// starts, or once it returned, it answers false after its wait. Any
// goroutine may call it: the level's mover does
// (docs/pending.md#24-the-mover-finishing-an-intent-after-a-crash-or-failover).
func (a *API) Routed(ctx context.Context) (caughtUp bool, err error) {
	return a.routed.wait(ctx)
}

// How long a cancel waits for the router to place the messages published
// before it (or a cascading message between two levels) before it gives up
// with [ErrRouterBehind].
const cancelWaitRouted = 25 * time.Second

// Run answers cancel requests on [contract.CancelSubject] until ctx is done,
// cancelWorkers at a time (one request waiting for the router does not hold
// up the others; each decision is still made by the owning scanner). Each
// costs an ingress stream info, an index lookup (one slot's records), a
// direct get and a tombstone write; an "already delivered" answer costs a
// second lookup and a message get from the index stream's leader instead
// (see [API.DecideID]). It also runs the routed wait, on a goroutine of
// its own, and unsubscribes what Subscribe subscribed before it returns.
func (a *API) Run(ctx context.Context) error {
	ch := a.ch
	defer a.Unsubscribe()
	// The routed wait's goroutine, stopped and waited for before Run
	// returns.
	rctx, stop := context.WithCancel(ctx)
	var routed sync.WaitGroup
	routed.Go(func() { a.waits.run(rctx) })
	defer routed.Wait()
	defer stop()
	// The workers read on the lookup connection when there is one
	// ([Config].LookupConn: the server walks the index inline on the
	// reading connection).
	rnc := (&worker{a.env}).readConn()
	var readers []*jswire.BatchReader
	for range cancelWorkers + 1 { // the last is the cancel-all worker's
		reader, err := jswire.NewBatchReader(rnc, index.Batch)
		if err != nil {
			for _, r := range readers {
				r.Close()
			}
			return err
		}
		readers = append(readers, reader)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if err := a.runLists(ctx, &wg, rnc); err != nil {
		for _, r := range readers {
			r.Close()
		}
		return err
	}
	a.runCancelAlls(ctx, &wg, readers[cancelWorkers])
	for _, reader := range readers[:cancelWorkers] {
		w := &worker{a.env} // this goroutine's
		wg.Go(func() {
			defer reader.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case q := <-ch:
					m := q.m
					if isStatusSubject(m.Subject) {
						w.serveStatus(ctx, reader, q)
						continue
					}
					if isRescheduleSubject(m.Subject) {
						w.serveReschedule(ctx, reader, q)
						continue
					}
					// The scoped form's target; "" for the unscoped form.
					scope, scoped := strings.CutPrefix(m.Subject, contract.CancelSubject+".")
					if !scoped {
						scope = ""
					}
					var (
						reply string
						err   error
					)
					if scoped && scope == "" {
						w.cfg.Cancels.NotFound.Add(1)
						reply = contract.CancelReplyNotFound
					} else {
						reply, err = w.Cancel(ctx, reader, string(m.Data), scope, q.at.Add(QueueWait))
					}
					if errors.Is(err, level.ErrCancelBusy) {
						w.cfg.Cancels.Busy.Add(1)
						err = level.ErrCancelBusy // the answer's text, not the path to it
						reply = contract.CancelReplyErrorPrefix + err.Error()
					} else if err != nil {
						if ctx.Err() != nil {
							return
						}
						w.logger.Warn("cancel failed", slog.String("id", string(m.Data)), slog.Any("error", err))
						reply = contract.CancelReplyErrorPrefix + err.Error()
					}
					_ = m.RespondMsg(replyMsg(reply, err))
				}
			}
		})
	}
	<-ctx.Done()
	return nil
}

const cancelWorkers = 4

// QueueMax is how many cancel requests wait for a cancel worker at
// most (deliver.CancelQueueMax). One that arrives while the queue is full is answered at once with
// [level.ErrCancelBusy] (code 429), without being looked at: under a storm every
// request gets a prompt answer, none is dropped unanswered, and the work
// (and its share of the CPU the deliveries need) stays bounded.
const QueueMax = 256

// QueueWait is how long a cancel request waits for its turn at the
// id index at most (deliver.CancelQueueWait; the lookups are paced: [Config].LookupShare).
// One that would wait longer is answered [level.ErrCancelBusy] (code 429) without
// being looked at, rather than late, after its requester gave up.
const QueueWait = 2 * time.Second

// Unsubscribe unsubscribes what Subscribe subscribed. Run does it
// before it returns; call it only when Run will not run.
func (a *API) Unsubscribe() {
	for _, sub := range a.subs {
		_ = sub.Unsubscribe()
	}
}

// queued is a cancel or status request and when it arrived.
type queued struct {
	m  *nats.Msg
	at time.Time
}

// Subscribe subscribes to [contract.CancelSubject] and the scoped
// "delayd.api.cancel.>" ([contract.CancelSubjectFor]), and to the status
// API's [contract.StatusSubject] and "delayd.api.status.>", and to the list
// API's [contract.PendingSubject] and "delayd.api.pending.>" ([contract.PendingSubjectFor]) and the cancel-all API's
// "delayd.api.cancelall.>" ([contract.CancelAllSubjectFor]), and to the reschedule API's
// [contract.RescheduleSubject] and "delayd.api.reschedule.>" (the cancel API's queue), queue group "delayd", and
// waits until the server has the subscriptions, so a request sent once the
// service is ready finds a responder. Requests go to the API's queue,
// at most [QueueMax] (list requests to their own, at most listQueueMax, and cancel-alls to
// theirs, at most cancelAllQueueMax), which Run serves; the subscriptions' goroutines
// answer the rest busy. Call it once, before Run.
func (a *API) Subscribe(ctx context.Context) error {
	ch, lists, cancelAlls := make(chan queued, QueueMax), make(chan queued, listQueueMax), make(chan queued, cancelAllQueueMax)
	enqueue := func(m *nats.Msg) {
		if m.Subject == contract.PendingSubject || strings.HasPrefix(m.Subject, contract.PendingSubject+".") {
			enqueueList(lists, a.cfg.Lists, m)
			return
		}
		if strings.HasPrefix(m.Subject, contract.CancelAllSubject+".") {
			enqueueCancelAll(cancelAlls, a.cfg.CancelAlls, m)
			return
		}
		select {
		case ch <- queued{m: m, at: time.Now()}:
		default:
			if isStatusSubject(m.Subject) {
				a.cfg.Statuses.Busy.Add(1)
			} else if isRescheduleSubject(m.Subject) {
				a.cfg.Reschedules.count(0, level.ErrCancelBusy)
			} else {
				a.cfg.Cancels.Busy.Add(1)
			}
			_ = m.RespondMsg(replyMsg(contract.CancelReplyErrorPrefix+level.ErrCancelBusy.Error(), level.ErrCancelBusy))
		}
	}
	var subs []*nats.Subscription
	for _, subject := range []string{contract.CancelSubject, contract.CancelSubject + ".>", contract.StatusSubject, contract.StatusSubject + ".>", contract.PendingSubject, contract.PendingSubject + ".>", contract.CancelAllSubject + ".>", contract.RescheduleSubject, contract.RescheduleSubject + ".>"} {
		sub, err := a.cfg.Conn.QueueSubscribe(subject, "delayd", enqueue)
		if err != nil {
			for _, sub := range subs {
				_ = sub.Unsubscribe()
			}
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	fctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	if err := a.cfg.Conn.FlushWithContext(fctx); err != nil {
		// Disconnected: the client subscribes again when it reconnects.
		a.logger.Warn("cancel API subscription not confirmed yet", slog.Any("error", err))
	}
	a.subs, a.ch, a.lists, a.cancelAlls = subs, ch, lists, cancelAlls
	return nil
}

// Cancel decides one cancel request and returns its reply's text. The id
// is a publisher's Nats-Msg-Id or an ingress sequence: a decimal id is
// whichever of the two delayd knows. "seq:N" names ingress sequence N,
// "id:X" the publisher's id X — unless a publisher's id is that text
// itself. The id a message without a publisher id was delivered with
// ("delayd-<ingress created>-<seq>-<MAC>", checked) names it too. An id
// with two readings that both name a message is refused with
// [ErrAmbiguousID].
//
// scope is the target of a scoped request (delayd.api.cancel.<target>), ""
// for the unscoped one: a message with another target is treated exactly
// as an unknown id (it is not found, and it does not make an id ambiguous),
// so a scoped request tells nothing about other targets' messages.
//
// notAfter bounds the wait for the paced index lookups: past it the
// answer is [level.ErrCancelBusy] (zero: no bound).
func (a *worker) Cancel(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time) (string, error) {
	answer, _, err := a.DecideID(ctx, reader, id, scope, notAfter, false)
	if err != nil {
		return "", err
	}
	switch answer {
	case level.AnswerCancelled:
		a.cfg.Cancels.Cancelled.Add(1)
		return contract.CancelReplyCancelled, nil
	case level.AnswerDelivered:
		a.cfg.Cancels.Delivered.Add(1)
		return contract.CancelReplyDelivered, nil
	}
	a.cfg.Cancels.NotFound.Add(1)
	return contract.CancelReplyNotFound, nil
}
