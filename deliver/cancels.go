package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/cancelapi"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
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
// level owners through [level.Owners]: the one place where a cancel meets
// the level owners (docs/reshape.md#22-the-one-interface-for-other-goroutines).
// Run calls it once setup has loaded the hop key and built the scanners.
func (s *Service) newCancelAPI(js jetstream.JetStream) *cancelapi.API {
	s.mu.Lock()
	owners := s.levelOwners(s.parts.levels)
	s.mu.Unlock()
	return cancelapi.New(cancelapi.Config{
		Conn: s.nc, LookupConn: s.cfg.LookupConn, JS: js, LookupShare: s.cfg.CancelLookupShare, HopKey: s.parts.hopKey,
		KeepAnswers: s.cfg.AnswerKeep != AnswerKeepOff, Decider: owners, Prefix: s.cfg.Prefix, Levels: s.cfg.Levels, RouterWaiting: s.dead.refused.RouterWaiting,
		Cancels: &s.answers.cancels, Statuses: &s.answers.statuses, Lists: &s.answers.lists, CancelAlls: &s.answers.cancelAlls, Reschedules: &s.answers.reschedules, MaxDelay: s.cfg.MaxDelay, Logger: s.logger, Hooks: cancelapi.Hooks{Looked: s.hooks.looked, CancelAllCut: s.hooks.cancelAllCut},
	})
}

// decideID is the cancel API's [cancelapi.API.DecideID] (the Service's
// tests ask it directly); Run must have built the API.
func (s *Service) decideID(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time, status bool) (level.CancelAnswer, time.Time, error) {
	return s.parts.cancelAPI.DecideID(ctx, reader, id, scope, notAfter, status)
}

// cancel is the cancel API's [cancelapi.API.Cancel] (the Service's tests
// ask it directly); Run must have built the API.
func (s *Service) cancel(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time) (string, error) {
	return s.parts.cancelAPI.Cancel(ctx, reader, id, scope, notAfter)
}
