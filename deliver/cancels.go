package deliver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/cancelapi"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/internal/lease"
)

// CancelLookupShareDefault is [Config].CancelLookupShare's default: a
// tenth of one core. `delaybench -scenarios cancel-storm` (2,000 cancels/s
// at a level delivering 10,000 msg/s, 2 cores) measured the level's
// lateness p99 at 1.4–2.0× the run without cancels with it, 1.1× with
// lookups all but off and 4.7× at a whole core (docs/benchmarks.md#cancel-storm).
const CancelLookupShareDefault = contract.CancelShareDefault

// CancelQueueMax is how many cancel requests wait for a cancel worker at
// most. One that arrives while the queue is full is answered at once with
// [ErrCancelBusy] (code 429), without being looked at: under a storm every
// request gets a prompt answer, none is dropped unanswered, and the work
// (and its share of the CPU the deliveries need) stays bounded.
const CancelQueueMax = 256

// CancelQueueWait is how long a cancel request waits for its turn at the
// id index at most (the lookups are paced: [Config].CancelLookupShare).
// One that would wait longer is answered [ErrCancelBusy] (code 429) without
// being looked at, rather than late, after its requester gave up.
const CancelQueueWait = 2 * time.Second

// The two above are cancelapi's, written out here for go doc; this fails
// to compile if they differ.
const _ = uint(CancelQueueMax-cancelapi.QueueMax) + uint(cancelapi.QueueMax-CancelQueueMax) +
	uint(CancelQueueWait-cancelapi.QueueWait) + uint(cancelapi.QueueWait-CancelQueueWait)

// newCancelAPI returns the cancel and status APIs
// (deliver/internal/cancelapi) on the Service's connections, asking the
// level owners through [cancelDecider]. Run calls it once setup has loaded
// the hop key.
func (s *Service) newCancelAPI(js jetstream.JetStream) *cancelapi.API {
	return cancelapi.New(cancelapi.Config{
		Conn: s.nc, LookupConn: s.cfg.LookupConn, JS: js, LookupShare: s.cfg.CancelLookupShare, HopKey: s.parts.hopKey,
		KeepAnswers: s.cfg.AnswerKeep != AnswerKeepOff, Decider: cancelDecider{s}, RouterWaiting: s.dead.refused.RouterWaiting,
		Cancels: &s.answers.cancels, Statuses: &s.answers.statuses, Logger: s.logger, Hooks: cancelapi.Hooks{Looked: s.hooks.looked},
	})
}

// decideID is the cancel API's [cancelapi.API.DecideID] (the Service's
// tests ask it directly); Run must have built the API.
func (s *Service) decideID(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time, status bool) (cancelAnswer, time.Time, error) {
	return s.parts.cancelAPI.DecideID(ctx, reader, id, scope, notAfter, status)
}

// cancel is the cancel API's [cancelapi.API.Cancel] (the Service's tests
// ask it directly); Run must have built the API.
func (s *Service) cancel(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time) (string, error) {
	return s.parts.cancelAPI.Cancel(ctx, reader, id, scope, notAfter)
}

// cancelDecider is the cancel and status APIs' way to a level's owner
// ([cancelapi.Decider]: the API asks it for every record it decides): the
// one place where a cancel meets the level owners. It holds the Service,
// and Decide is [Service.decideOwned] on the level's scanner
// (docs/reshape.md#22-the-one-interface-for-other-goroutines).
type cancelDecider struct{ s *Service }

// Decide has the owner of rec's level decide its cancel, or with status
// its status ([Service.decideOwned]); a level stream this Service does not
// scan answers answerGone.
func (d cancelDecider) Decide(ctx context.Context, reader *jswire.BatchReader, rec index.Record, status bool) (cancelAnswer, error) {
	d.s.mu.Lock()
	sc := d.s.parts.scanners[rec.Stream]
	d.s.mu.Unlock()
	if sc == nil {
		return answerGone, nil
	}
	return d.s.decideOwned(ctx, reader, sc, rec, status)
}

// decideOwned has the level's owner decide the cancel (or, with status,
// the status) of the message rec places: this replica's scanner if it
// owns the level, else the owner, through the level's decide subject
// ([contract.DecideSubject]). While no replica answers as the owner (the
// lease is changing hands: a start, a crash, a pause), it asks again with
// backoff for up to twice the lease TTL, then gives up with an error to
// send the request again. Asking again is safe: a sequence already
// cancelled answers "cancelled".
func (s *Service) decideOwned(ctx context.Context, reader *jswire.BatchReader, sc *Scanner, rec index.Record, status bool) (cancelAnswer, error) {
	deadline := time.Now().Add(2 * cmp.Or(s.cfg.LeaseTTL, lease.TTLDefault))
	pause := 10 * time.Millisecond
	op := level.DecideOpCancel
	if status {
		op = level.DecideOpStatus
	}
	for {
		var (
			answer cancelAnswer
			err    error
		)
		if sc.l.Owned() {
			if status {
				answer, err = sc.requestStatus(ctx, rec)
			} else {
				answer, err = sc.requestCancel(ctx, reader, rec)
			}
			if !errors.Is(err, errNotOwner) {
				return answer, err
			}
		} else {
			answer, err = level.AskDecision(ctx, s.nc, op, rec)
			if !errors.Is(err, errNoOwner) {
				return answer, err
			}
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("level stream %s has no owner deciding now (its lease is changing hands: %v); send the request again", rec.Stream, err)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return 0, err
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}
