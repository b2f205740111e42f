package level

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// groups.go: the groups of the fields of a [Level] (what outlives a term)
// and of its owner (what is fresh each term; docs/reshape.md 2.1). Each is
// a value field, used through the *Level or the *owner only (several hold
// atomics). Unless a field's comment says otherwise, only the current
// owner's loop (the goroutine running RunTerm or Run) reads and writes it.

// deps are what a scanner talks to the server through. Set by New,
// immutable after.
type deps struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// levelClock is the scanner's estimate of the server's clock and the last
// observations behind it. Written by the scanner's goroutine; Stats reads
// srv under serverClock's lock.
type levelClock struct {
	// srv estimates the server's clock, a lower bound: a message stored at
	// server time ts and read at monotonic reading m proves the server's
	// clock had passed ts by m. Delivering once the estimate reaches due
	// therefore is never early by the server's clock, and a step of the
	// local wall clock does not move it (docs/guarantees.md#never-early).
	srv *serverClock
	// freshSeq is the level stream's last sequence at the last fresh
	// observation: messages up to it tell the estimate nothing new.
	freshSeq uint64
	// obsSeq and obsStored are the last message observed: a later sequence
	// stored at an earlier time shows the server's clock stepped back.
	obsSeq    uint64
	obsStored time.Time
}

// counters are the scanner's counters and the stall clock, atomics: the
// scanner's goroutine writes them (lastSeq also [Level.Written], from the
// router's acker, a max register; epoch and headDue also RunTerm), and
// Stats, Stalled and the Service read them from any goroutine.
type counters struct {
	steps        atomic.Uint64
	lastSeq      atomic.Uint64 // the level stream's last sequence, as far as known
	headDue      atomic.Int64  // unix ns of a due head not yet delivered; 0 if none
	lastProgress atomic.Int64  // Clock.Mono reading: the last offset move, no due head, or a head falling due
	cancelledN   atomic.Uint64

	delivered, deadLettered, retries, forwarded atomic.Uint64
	lastLateness                                atomic.Int64

	// epoch mirrors the last term for Stats (with the term slot); fencedWrites
	// counts fenced commits.
	epoch        atomic.Uint64
	fencedWrites atomic.Uint64
}

// ioSet is what an owner's run opens for the term and closes before it
// returns, and the tombstones stream and delivery-id key its load opens.
// The owner's loop only.
type ioSet struct {
	reader *jswire.BatchReader
	// acks publishes the deliveries to stream-bound targets and the hop
	// forwards and tracks their PubAcks (one reply subscription for the
	// scanner, a write failing after ackTimeout without one, or at once
	// when the connection starts reconnecting); open while Run runs.
	acks       *jswire.PubAcks
	feed       *feed
	tombstones jetstream.Stream // CancelStream
	idMAC      *hop.IDMAC       // derives delivery ids (the owner's loop)
	mover      *mover           // settles loaded moves (opened by run)
}

// streamLife is the life of the level stream the position belongs to, as
// the scanner's load found it. The owner's loop only.
type streamLife struct {
	stream   jetstream.Stream
	created  time.Time // the level stream's creation time
	loadTail uint64    // the level stream's last sequence at the load
	loadedAt time.Time // when the scanner (re)loaded, by the server's clock
}

// position is where the scanner is in the level stream: what is confirmed,
// what it reads next, and what it purged. The owner's loop only.
type position struct {
	offset     uint64 // last confirmed sequence
	next       uint64 // next sequence to read
	purgedTo   uint64
	lastPurge  time.Duration // monotonic reading of the last purge
	tombsAcked uint64        // the acknowledged offset tombstones were last dropped to
	reload     bool          // load again: the stream is not the one the offset belongs to
}

// headState is the message the scanner waits for or delivers, and the
// state of the feed it reads it from. The owner's loop only.
type headState struct {
	msg       *nats.Msg // the message being waited for or delivered
	meta      jswire.AckMeta
	fresh     bool   // no message read since the feed restarted
	resetFeed bool   // the feed must restart at next
	gateHeld  string // what the order gate last held the head for (logged once)
}

// confirmation is the deliveries awaiting confirmation and how the
// scanner confirms them. The owner's loop only.
type confirmation struct {
	win *window // the confirmation window: deliveries in flight and their outcomes
	// coreUnflushed is set by the first core publish since the last flush,
	// with coreReconnects, the connection's reconnect count then: a
	// different count at the next flush means a reconnect in between,
	// which that flush cannot vouch for.
	coreUnflushed  bool
	coreReconnects uint64
	backoff        *backoff.Backoff
}

// cancelState is the level's side of the cancel API that outlives a
// term (docs/reshape.md 2.1, R5): the book, and the retirer's queue. A
// term that begins while the previous term's cancel writes its tombstone
// finds its reservation in the book.
type cancelState struct {
	book *cancelBook // tombstones and reservations: the one owner of cancel state (its own lock)
	// retire holds tombstones to delete: the current owner's loop sends,
	// its retirer receives.
	retire chan retiree
}

// published is what an owner publishes for other goroutines, read
// without its loop's turn: passed (an atomic) and ready (a channel). The
// loop writes passed; its load sets and resets ready.
type published struct {
	passed atomic.Uint64 // highest sequence handed off (delivered, forwarded, skipped)
	// ready is closed once the owner's load loaded the offset and the
	// tombstones (in a term: after its bump): from then on the owner
	// answers for this replica's view of the level (today's "decides").
	ready readiness
}

// termSlot is where other goroutines find a level's current owner. begin
// and end are called by the goroutine that runs the term (RunTerm); get
// by any.
type termSlot struct {
	mu sync.Mutex
	o  *owner // nil between terms ("owned here" ⇔ o != nil)
}

// begin makes o the level's current owner.
func (t *termSlot) begin(o *owner) {
	t.mu.Lock()
	t.o = o
	t.mu.Unlock()
}

// end empties the slot if o is still its owner.
func (t *termSlot) end(o *owner) {
	t.mu.Lock()
	if t.o == o {
		t.o = nil
	}
	t.mu.Unlock()
}

// get returns the current owner, nil between terms.
func (t *termSlot) get() *owner {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.o
}

// readiness is closed once a load has finished: the offset key bumped
// and the tombstones loaded. A reload (the stream recreated, mid-term)
// replaces it with an open one. The owner's loop sets and resets it; any
// goroutine waits on it.
type readiness struct {
	mu sync.Mutex
	ch chan struct{} // nil: open, not made yet
}

// wait returns the channel closed when the current load has finished.
func (r *readiness) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

// done reports whether the current load has finished.
func (r *readiness) done() bool {
	select {
	case <-r.wait():
		return true
	default:
		return false
	}
}

// set marks the current load finished.
func (r *readiness) set() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	select {
	case <-r.ch:
	default:
		close(r.ch)
	}
}

// reset starts a load: a finished one's channel is replaced by an open
// one (an open one stays, so its waiters wait on).
func (r *readiness) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		return
	}
	select {
	case <-r.ch:
		r.ch = nil
	default:
	}
}

// testHooks are set by tests before Run; Run reads them.
type testHooks struct {
	ackTimeout time.Duration                             // how long a write waits for its PubAck (jswire.WriteAttempt; tests shorten it)
	loseAcks   func(n uint64) bool                       // tests: the n-th write's PubAck is dropped (jswire.PubAcks.LoseReplies)
	loseReads  func(n uint64) bool                       // tests: the replies to the term reader's n-th direct get are dropped (jswire.BatchReader.LoseReplies)
	losePurge  func(ctx context.Context, op string) bool // tests: a try (its context ctx) of a purge's stream info ("info") or purge ("purge") that returns true is never sent, as if the stream's leader hung (purge)
	// pendingWait replaces DecidePendingWait in owner.pending when not 0:
	// a test that must tell an answer caused by the load (or the term's
	// end) from one caused by the wait running out sets it to an hour.
	pendingWait time.Duration
	// moveStep, when set, is asked after each step of Level.completeMove
	// (1: checked; 2: intent stored; 4: fenced; 5: new message stored;
	// 7: placed mark written); true ends the move there as a kill would
	// (nothing more written, the reservation not released: the test ends
	// the term).
	moveStep func(step int) bool
}
