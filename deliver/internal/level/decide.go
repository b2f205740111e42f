package level

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/offsets"
)

// Decisions that need a level's owner (docs/guide.md#cancel,
// docs/guide.md#merge-delay-merge-key and docs/operations.md#jetstream-resources): a cancel of one of the level's messages and the
// router's merge check are decided by the replica that holds the level's
// lease.
// The owner serves the level's decide subject ([contract.DecideSubject])
// for as long as its term runs: it subscribes when the term starts and
// unsubscribes before the term's work returns, so before the lease is
// released. A replica that does not own the level sends the decision
// there. The subject is internal: its request and reply formats are no
// user contract.

// Decide operations.
const (
	decideOpCancel  = "cancel"  // cancel the message the record places (local.Cancel)
	decideOpPending = "pending" // is the message the record places pending (local.Pending)?
	decideOpPassed  = "passed"  // the highest sequence the owner handed off (decimal reply); no record
	decideOpStatus  = "status"  // the status of the message the record places (local.Status)
	decideOpSift    = "sift"    // which of seqs are pending (Owners.Sift; JSON Sifted reply); no record
	// decideOpReschedule moves the message the record places to NewDue
	// (local.Decide with AskReschedule). An owner older than it answers
	// "bad decide request: unknown op", never a cancel.
	decideOpReschedule = "reschedule"
)

// decideRequest is a request on a level stream's decide subject, as JSON:
// the operation and the index record that places the message in the
// level.
type decideRequest struct {
	Op     string    `json:"op"`
	Key    string    `json:"key"`
	Seq    uint64    `json:"seq"`
	Hop    bool      `json:"hop,omitempty"`
	Due    time.Time `json:"due,omitzero"`
	Target string    `json:"target,omitempty"`
	Seqs   []uint64  `json:"seqs,omitempty"` // sift's
	// NewDue is a reschedule's new due, a server time.
	NewDue time.Time `json:"new_due,omitzero"`
}

func newDecideRequest(op string, rec index.Record) decideRequest {
	return decideRequest{Op: op, Key: rec.Key, Seq: rec.Seq, Hop: rec.Hop, Due: rec.Due, Target: rec.Target}
}

func (r decideRequest) record(stream string) index.Record {
	return index.Record{Key: r.Key, Stream: stream, Seq: r.Seq, Hop: r.Hop, Due: r.Due, Target: r.Target}
}

// Replies on a decide subject: the body is exactly one of these (for
// "passed", a decimal sequence), or [contract.CancelReplyErrorPrefix] and
// a one-line reason.
const (
	decideCancelled  = "cancelled"   // AnswerCancelled
	decideDelivered  = "delivered"   // AnswerDelivered
	decideForwarded  = "forwarded"   // AnswerForwarded
	decideGone       = "gone"        // AnswerGone
	decideRetry      = "retry"       // AnswerRetry
	decideMoved      = "rescheduled" // AnswerRescheduled
	decidePending    = "pending"     // local.Pending: true
	decideNotPending = "not pending" // local.Pending: false
	decideNotOwner   = "not owner"   // this replica's term ended: ask again (the next owner)
	decideBusyReply  = contract.CancelReplyErrorPrefix + "busy"
)

// Decide limits.
const (
	decideQueueMax    = 64                     // cancel decisions waiting for a worker, per level
	decideWorkers     = 2                      // cancel decisions in flight, per level
	DecidePendingWait = 500 * time.Millisecond // the router's wait for a merge check's answer
	// decideSilence is how long the router asks no merge question of a
	// level whose owner did not answer one in DecidePendingWait (a paused
	// owner): each would hold the router that long, for "not pending".
	decideSilence = time.Second
	// decideCancelWait bounds one cancel decision sent to the owner: its
	// tombstone write (jswire.OpTimeout) and the scanner's grace.
	decideCancelWait = jswire.OpTimeout + reservationSlack + 2*time.Second
	// decideMoveWait bounds one reschedule decision sent to the owner: its
	// intent write, the fence's read and its new message's writes (each up
	// to jswire.OpTimeout), and the scanner's grace.
	decideMoveWait = 3*jswire.OpTimeout + reservationSlack + 2*time.Second
)

var answerText = map[CancelAnswer]string{
	AnswerCancelled: decideCancelled, AnswerDelivered: decideDelivered, AnswerForwarded: decideForwarded,
	AnswerGone: decideGone, AnswerRetry: decideRetry, AnswerPending: decidePending, AnswerRescheduled: decideMoved,
}

// errOwnerSilent, which wraps [ErrNoOwner] (no replica
// answered for the level as its owner), is the case of a request no one
// answered in time.
var errOwnerSilent = fmt.Errorf("%w in time", ErrNoOwner)

// decideServer is the NATS side of [remote] for one term: it serves the
// level's decide subject ([contract.DecideSubject]) for its owner's term.
// Its handlers answer with the owner's own methods: "pending" and "passed"
// on the subscription's goroutine, without waiting for the term's load
// (pendingNow, passedNow: "not pending" and "0" until it has loaded);
// "cancel" and "status" on its workers (decideWorkers), through a bounded
// queue (decideQueueMax), by [owner.ask], as a local cancel is decided.
// RunTerm starts it when the term begins and stops it before it returns,
// so before the lease is released. A subscription that fails is logged:
// requesters then find no owner, as during a failover. Start and Stop run
// on RunTerm's goroutine; the fields are set by Start, before any handler
// or worker runs, and only read after.
type decideServer struct {
	o      *owner
	ctx    context.Context // Start's; done once Stop began
	cancel context.CancelFunc
	queue  chan *nats.Msg     // cancel and status requests waiting for a worker
	sub    *nats.Subscription // nil if the subscription failed
	wg     sync.WaitGroup     // the workers
	once   sync.Once
}

// newDecideServer returns the decide server of o's term, not started.
func newDecideServer(o *owner) *decideServer {
	return &decideServer{o: o, queue: make(chan *nats.Msg, decideQueueMax)}
}

// Start subscribes to the level's decide subject and starts the workers,
// until Stop is called (or ctx is done).
func (d *decideServer) Start(ctx context.Context) {
	s := d.o
	d.ctx, d.cancel = context.WithCancel(ctx)
	sub, err := s.deps.nc.Subscribe(contract.DecideSubject(s.cfg.Stream), d.handle)
	if err != nil {
		s.logger.Warn("decide subject not served this term", slog.String("subject", contract.DecideSubject(s.cfg.Stream)), slog.Any("error", err))
		d.cancel()
		return
	}
	d.sub = sub
	for range decideWorkers {
		reader, err := jswire.NewBatchReader(s.deps.nc, 1)
		if err != nil {
			s.logger.Warn("decide worker not started", slog.Any("error", err))
			continue
		}
		d.wg.Go(func() {
			defer reader.Close()
			d.work(reader)
		})
	}
}

// Stop unsubscribes, ends the decisions in flight (their requesters are
// answered "not owner" or an error) and waits for the workers: the term's
// work calls it before it returns, so before the lease is released.
func (d *decideServer) Stop() {
	d.once.Do(func() {
		if d.sub == nil {
			return // never subscribed
		}
		_ = d.sub.Unsubscribe()
		d.cancel()
		d.wg.Wait()
		for { // answer what the workers did not take
			select {
			case m := <-d.queue:
				d.respond(m, decideNotOwner)
			default:
				return
			}
		}
	})
}

func (d *decideServer) respond(m *nats.Msg, body string) {
	if err := m.Respond([]byte(body)); err != nil && d.ctx.Err() == nil {
		d.o.logger.Debug("decide reply failed", slog.Any("error", err))
	}
}

// handle is the subscription's callback: it answers "pending" and
// "passed" at once and queues "cancel" and "status" for the workers.
func (d *decideServer) handle(m *nats.Msg) {
	s := d.o
	if m.Reply == "" {
		return
	}
	var req decideRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || (req.Key == "" && req.Op != decideOpPassed && req.Op != decideOpSift) {
		d.respond(m, contract.CancelReplyErrorPrefix+"bad decide request: want JSON with op, key and seq")
		return
	}
	if !s.term.Held() || d.ctx.Err() != nil {
		d.respond(m, decideNotOwner)
		return
	}
	switch req.Op {
	case decideOpPassed:
		d.respond(m, strconv.FormatUint(s.passedNow(), 10))
	case decideOpSift:
		d.respond(m, d.serveSift(req))
	case decideOpPending:
		// No I/O: answered on the subscription's goroutine.
		if s.pendingNow(req.record(s.cfg.Stream)) {
			d.respond(m, decidePending)
		} else {
			d.respond(m, decideNotPending)
		}
	case decideOpCancel, decideOpStatus, decideOpReschedule:
		select {
		case d.queue <- m:
		default:
			d.respond(m, decideBusyReply)
		}
	default:
		d.respond(m, contract.CancelReplyErrorPrefix+fmt.Sprintf("bad decide request: unknown op %q", req.Op))
	}
}

// work decides the queued cancel and status requests, reading with reader,
// until Stop.
func (d *decideServer) work(reader *jswire.BatchReader) {
	s := d.o
	for {
		var m *nats.Msg
		select {
		case <-d.ctx.Done():
			return
		case m = <-d.queue:
		}
		var req decideRequest
		_ = json.Unmarshal(m.Data, &req) // checked by the subscription
		if !s.term.Held() {
			d.respond(m, decideNotOwner)
			continue
		}
		var (
			answer CancelAnswer
			err    error
		)
		switch req.Op {
		case decideOpStatus:
			answer, err = s.ask(d.ctx, nil, req.record(s.cfg.Stream), Ask{Op: AskStatus})
		case decideOpReschedule:
			answer, err = s.ask(d.ctx, reader, req.record(s.cfg.Stream), Ask{Op: AskReschedule, Due: req.NewDue})
		default:
			answer, err = s.ask(d.ctx, reader, req.record(s.cfg.Stream), Ask{Op: AskCancel})
		}
		switch {
		case err == nil:
			d.respond(m, answerText[answer])
		case errors.Is(err, ownership.ErrNotOwner) || d.ctx.Err() != nil:
			d.respond(m, decideNotOwner)
		default:
			d.respond(m, contract.CancelReplyErrorPrefix+err.Error())
		}
	}
}

// askOwner sends req to the owner of stream and returns its reply's body,
// waiting at most wait (and not past ctx). No responder, no answer in
// time, or a "not owner" reply return [ErrNoOwner], wrapped.
func askOwner(ctx context.Context, nc *nats.Conn, stream string, req decideRequest, wait time.Duration) (string, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return "", err // cannot happen: strings, numbers and a time
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, contract.DecideSubject(stream), data)
	switch {
	case err == nil:
	case errors.Is(err, nats.ErrNoResponders):
		return "", fmt.Errorf("level stream %s: %w (no replica holds its lease now)", stream, ErrNoOwner)
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return "", fmt.Errorf("level stream %s: %w (waited %s)", stream, errOwnerSilent, wait)
	default:
		return "", fmt.Errorf("level stream %s: decide request: %w", stream, err)
	}
	body := string(m.Data)
	if body == decideNotOwner {
		return "", fmt.Errorf("level stream %s: %w (its owner's term ended)", stream, ErrNoOwner)
	}
	return body, nil
}

// askDecision sends req (decideOpCancel, decideOpStatus or
// decideOpReschedule, of the message rec places) to its level's owner,
// waiting at most wait, and returns the owner's decision. Errors:
// [ErrNoOwner] (ask again), the owner's error ([ErrCancelBusy] when its
// queue is full), ctx's.
func askDecision(ctx context.Context, nc *nats.Conn, req decideRequest, rec index.Record, wait time.Duration) (CancelAnswer, error) {
	body, err := askOwner(ctx, nc, rec.Stream, req, wait)
	if err != nil {
		return 0, err
	}
	for a, text := range answerText {
		if body == text {
			return a, nil
		}
	}
	if body == decideBusyReply {
		return 0, ErrCancelBusy
	}
	if reason, ok := strings.CutPrefix(body, contract.CancelReplyErrorPrefix); ok {
		return 0, fmt.Errorf("owner of level stream %s: %s", rec.Stream, reason)
	}
	return 0, fmt.Errorf("owner of level stream %s: unexpected decide reply %s", rec.Stream, clip([]byte(body), 64))
}

// remote asks the owner of a level on another replica, over the level's
// decide subject ([decideServer] answers). For the router's merge
// questions (Pending, Passed) it remembers the levels whose owner did not
// answer in time, and asks them nothing for [decideSilence]: the router
// waits for each answer. Safe for concurrent use.
type remote struct {
	nc *nats.Conn

	mu     sync.Mutex
	silent map[string]time.Time // level stream -> ask again after
}

var _ Asker = (*remote)(nil)

func newRemote(nc *nats.Conn) *remote {
	return &remote{nc: nc, silent: make(map[string]time.Time)}
}

// Decide sends ask about the message rec places to its level's owner
// ([askDecision]); reader is not used: the owner reads.
func (p *remote) Decide(ctx context.Context, _ *jswire.BatchReader, rec index.Record, ask Ask) (CancelAnswer, error) {
	switch ask.Op {
	case AskCancel:
		return askDecision(ctx, p.nc, newDecideRequest(decideOpCancel, rec), rec, decideCancelWait)
	case AskStatus:
		return askDecision(ctx, p.nc, newDecideRequest(decideOpStatus, rec), rec, decideCancelWait)
	case AskReschedule:
		req := newDecideRequest(decideOpReschedule, rec)
		req.NewDue = ask.Due
		return askDecision(ctx, p.nc, req, rec, decideMoveWait)
	}
	return 0, fmt.Errorf("level stream %s: unknown question %d", rec.Stream, ask.Op)
}

// Pending reports the owner's answer to "is the message rec places
// pending?"; no answer (no owner, a failover, a timeout) is "not pending",
// which costs a merge and never loses a message.
func (p *remote) Pending(ctx context.Context, rec index.Record) bool {
	p.mu.Lock()
	until, quiet := p.silent[rec.Stream]
	p.mu.Unlock()
	if quiet && time.Now().Before(until) {
		return false
	}
	body, err := askOwner(ctx, p.nc, rec.Stream, newDecideRequest(decideOpPending, rec), DecidePendingWait)
	if errors.Is(err, errOwnerSilent) {
		p.mu.Lock()
		p.silent[rec.Stream] = time.Now().Add(decideSilence)
		p.mu.Unlock()
	}
	return err == nil && body == decidePending
}

// Passed returns the highest sequence the owner of stream handed off (for
// the router's check that a hop's purged level message was placed); 0,
// which places nothing, when no owner answers.
func (p *remote) Passed(ctx context.Context, stream string) uint64 {
	p.mu.Lock()
	until, quiet := p.silent[stream]
	p.mu.Unlock()
	if quiet && time.Now().Before(until) {
		return 0
	}
	body, err := askOwner(ctx, p.nc, stream, decideRequest{Op: decideOpPassed}, DecidePendingWait)
	if errors.Is(err, errOwnerSilent) {
		p.mu.Lock()
		p.silent[stream] = time.Now().Add(decideSilence)
		p.mu.Unlock()
	}
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(body, 10, 64)
	return n
}

// confirmOwner is the fenced check a cancel makes after its tombstone is
// stored and before it answers "cancelled": the term t that reserved the
// sequence is still valid, and no other replica wrote the level's offset
// key since this term bumped it (read from the key's stream leader, not a
// follower that may lag). A new owner bumps that key before it loads the
// level's tombstones, so a check that passes after the tombstone was
// stored means every later owner loads it. It returns an error wrapping
// [ownership.ErrNotOwner] otherwise.
func (s *Level) confirmOwner(ctx context.Context, t ownership.Term) error {
	notOwner := fmt.Errorf("level stream %s: %w (the term ended while the cancel tombstone was stored)", s.cfg.Stream, ownership.ErrNotOwner)
	if !t.Held() || s.commits.Fenced() {
		return notOwner
	}
	if !s.cfg.Fenced {
		return nil // a scanner on its own: no other owner
	}
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	_, rev, found, err := jswire.LastOnSubject(ctx, s.deps.nc, "KV_"+offsets.Bucket, "$KV."+offsets.Bucket+"."+s.cfg.Stream)
	if err != nil {
		return fmt.Errorf("level stream %s: offset key check: %w", s.cfg.Stream, err)
	}
	if !found {
		// Never written: only the lease orders this term before the next.
		if !t.Held() {
			return notOwner
		}
		return nil
	}
	// A revision above the committer's is this term's own write in
	// flight (the committer learns it once the write is answered), or
	// another writer's. With no write of this term outstanding (every
	// offset given to the committer acknowledged), read before the
	// committer's revision, it is another's.
	for {
		committed, acked := s.commits.Committed(), s.commits.Stored()
		switch {
		case !t.Held() || s.commits.Fenced():
			return notOwner
		case s.commits.Revision() >= rev:
			return nil
		case committed == acked:
			return fmt.Errorf("level stream %s: %w (its offset key was written at revision %d by another owner)", s.cfg.Stream, ownership.ErrNotOwner, rev)
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return fmt.Errorf("level stream %s: offset key check: %w", s.cfg.Stream, err)
		}
	}
}
