package level

import (
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// groups.go: the groups of a [Level]'s fields (docs/reshape.md 2.1). Each
// is a value field of the Level, used through the *Level only (several
// hold atomics). Unless a field's comment says otherwise, only the
// scanner's goroutine (the one running Run) reads and writes it.

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

	// epoch mirrors the term for Stats (with termRun.owned); fencedWrites
	// counts fenced commits.
	epoch        atomic.Uint64
	fencedWrites atomic.Uint64
}

// ioSet is what Run opens for a run of the scanner and closes before it
// returns, and the tombstones stream and delivery-id key its start loads.
// Scanner goroutine only.
type ioSet struct {
	reader *jswire.BatchReader
	// acks publishes the deliveries to stream-bound targets and the hop
	// forwards and tracks their PubAcks (one reply subscription for the
	// scanner, a write failing after ackTimeout without one, or at once
	// when the connection starts reconnecting); open while Run runs.
	acks       *jswire.PubAcks
	feed       *feed
	tombstones jetstream.Stream // CancelStream
	idMAC      *idMAC           // derives delivery ids (scanner goroutine)
}

// streamLife is the life of the level stream the position belongs to, as
// the scanner's start found it. Scanner goroutine only.
type streamLife struct {
	stream    jetstream.Stream
	created   time.Time // the level stream's creation time
	startTail uint64    // the level stream's last sequence at start
	startedAt time.Time // when the scanner (re)started, by the server's clock
}

// position is where the scanner is in the level stream: what is confirmed,
// what it reads next, and what it purged. Scanner goroutine only.
type position struct {
	offset     uint64 // last confirmed sequence
	next       uint64 // next sequence to read
	purgedTo   uint64
	lastPurge  time.Duration // monotonic reading of the last purge
	tombsAcked uint64        // the acknowledged offset tombstones were last dropped to
	restart    bool          // start over: the stream is not the one the offset belongs to
}

// headState is the message the scanner waits for or delivers, and the
// state of the feed it reads it from. Scanner goroutine only.
type headState struct {
	msg       *nats.Msg // the message being waited for or delivered
	meta      jswire.AckMeta
	fresh     bool   // no message read since the feed restarted
	resetFeed bool   // the feed must restart at next
	gateHeld  string // what the order gate last held the head for (logged once)
}

// confirmation is the deliveries awaiting confirmation and how the
// scanner confirms them. Scanner goroutine only.
type confirmation struct {
	win *window // the confirmation window: deliveries in flight and their outcomes
	// coreUnflushed is set by the first core publish since the last flush,
	// with coreReconnects, the connection's reconnect count then: a
	// different count at the next flush means a reconnect in between,
	// which that flush cannot vouch for.
	coreUnflushed  bool
	coreReconnects uint64
	backoff        *backoff
}

// cancelState is the scanner's side of the cancel API: the queue of
// cancel requests other goroutines send it, the book, and the janitor's
// queue.
type cancelState struct {
	asks chan cancelReq // cancel requests, decided on the scanner's goroutine (no I/O there)
	wake chan struct{}  // wakes the scanner from a wait to decide them
	book *cancelBook    // tombstones and reservations: the one owner of cancel state
	// janitor holds tombstones to delete: the scanner's goroutine sends,
	// runJanitor receives.
	janitor chan retiree
}

// termRun is the lease term the scanner runs in and what other goroutines
// read of it without the scanner's turn.
type termRun struct {
	// term is the lease term the scanner runs in ([Level.RunTerm]); the
	// zero Term, always held, for a scanner on its own. fencedStop is set
	// when an offset commit failed its compare-and-set: the level stops.
	// Level goroutine only.
	term       ownership.Term
	fencedStop bool
	// owned mirrors term for Stats and the cancel API (with
	// counters.epoch). Written by RunTerm.
	owned atomic.Bool
	// decides is set once the scanner's start loaded its offset and
	// tombstones (in a term: after its bump): from then on PendingAt
	// answers for this replica's view of the level. Cleared at each
	// (re)start and at the term's end.
	decides atomic.Bool
	passed  atomic.Uint64 // highest sequence handed off (delivered, forwarded, skipped)
}

// testHooks are set by tests before Run; Run reads them.
type testHooks struct {
	ackTimeout time.Duration       // how long a write waits for its PubAck (writeAttempt; tests shorten it)
	loseAcks   func(n uint64) bool // tests: the n-th write's PubAck is dropped (jswire.PubAcks.LoseReplies)
}
