package deliver

import (
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/deliver/internal/cancelapi"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/routing"
)

// The value-typed groups of [Service]'s fields (docs/reshape.md#42-structs-over-20-fields).

// deadLetters are a Service's dead-letter counters, shared with its
// routers and scanners (routing.Wiring, level.Wiring): each writes them on
// its own goroutine when it dead-letters or DELAYD_DLQ refuses.
type deadLetters struct {
	reasons message.ReasonCounts
	refused message.Refusals // dead letters DELAYD_DLQ refused, not stored yet
}

// serviceParts are the parts setup and Run build, on Run's goroutine:
// routers and levels under [Service].mu, the others before they are
// read.
type serviceParts struct {
	routers []*routing.Router // by ingress partition
	levels  levelSet

	hopKey hop.Key // set by setup
	// boundaries are, by level delay, the boundaries of its streams at
	// the last change of its partition count, while old messages may be
	// pending (docs/operations.md#partitions-for-hot-levels); set by setup.
	boundaries map[time.Duration]map[string]uint64
	cancelAPI  *cancelapi.API // the cancel and status APIs; set by Run
}

// serviceAnswers are the answers' counters: the cancel and status APIs'
// (written by the API's goroutines) and the kept answers' (bounds set in
// New, counters written by the janitor's trim goroutine).
type serviceAnswers struct {
	cancels, statuses answerCounts // the cancel and status APIs' answers (CancelStats, StatusStats)
	// lists, cancelAlls are the list and cancel-all APIs' answers
	// (ListStats, CancelAllStats).
	lists, cancelAlls cancelapi.RequestCounts
	reschedules       cancelapi.RescheduleCounts // the reschedule API's answers (RescheduleStats)
	work              answerWork                 // the kept answers' bounds and counters
}

// serviceLeases are this Service's side of the leases, all set by Run on
// its goroutine: leases and holder under [Service].mu, gains, balancer
// and onLease before the electors start. The electors report their
// events to [serviceLeases.event]; the Service only reads.
type serviceLeases struct {
	// leases are the electors' counters by lease key, filled by Run before
	// the electors start and read-only after.
	leases map[string]*leaseState
	// gains logs this replica's lease gains in one line per burst; set
	// by Run before the electors start.
	gains *gainLog
	// onLease is [testHooks].onLease, set by Run before the electors
	// start (tests set their hooks before Run).
	onLease func(ownership.Event)

	balancer atomic.Pointer[ownership.Balancer] // set by Run

	// holder is this Service's lease holder id, set by Run.
	holder string
}

// testHooks are a Service's test hooks and test-only counters, set
// before Run: each hook, if set, runs at one point of the Service's work,
// on the goroutine doing it.
type testHooks struct {
	// ingressChanging runs in setup between the check that
	// DELAYD_INGRESS is empty and the update of its transform at a
	// change of the ingress partition count.
	ingressChanging func()
	// looked runs in DecideID between the index lookup of a cancel's or
	// status request's id and the owner's decision, with the record
	// found.
	looked func(index.Record)
	// cancelAllCut runs in a cancel-all once its cut (the ingress
	// sequence above which messages are not cancelled) is fixed.
	cancelAllCut func(cut uint64)
	// onLease sees every elector's events, on the elector's goroutine.
	onLease func(ownership.Event)
	// tailHook is called before each tail read of a level stream by a
	// router; its error fails the read.
	tailHook func(stream string) error
	// noBid, if set, names lease keys this Service does not bid for, to
	// pin ownership on another replica; Run asks it for each lease key.
	noBid func(key string) bool

	trimPasses atomic.Uint64 // id index trim passes run, by the janitor
}
