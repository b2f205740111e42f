package level

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
)

// cancelBook is one level's cancel state: the tombstones of its cancelled
// messages and the reservations of the cancels in flight. It is its only
// owner: every field, and the mutable state of every tombstone it holds,
// is behind mu and reached only through its methods, which hand out
// copies. The scanner's goroutine, the cancel workers, the janitor and the
// router (merge checks) all go through it.
//
// A sequence is in at most one of three states here: free, reserved (a
// cancel is writing its tombstone: the scanner does not pass it until the
// reservation is resolved, released or expired) or tombstoned (cancelled:
// the scanner skips it).
type cancelBook struct {
	mu       sync.Mutex
	tombs    map[uint64]*tombEntry
	reserved map[uint64]*reservation
	min      uint64 // no tombstone below it waits for the janitor
}

// tombEntry is a tombstone and its mutable state, which only the book
// touches.
type tombEntry struct {
	t        index.Tombstone
	indexed  bool // its "cancelled" index records are written
	dropping bool // handed to the janitor
}

// reservation is a cancel in flight for one sequence of the level: the
// scanner's goroutine decided the sequence is not passed, and the
// requesting goroutine does the I/O (the read that checks the message, the
// tombstone write and its PubAck) by deadline.
type reservation struct {
	seq      uint64
	deadline time.Time     // the I/O's deadline; the scanner waits for it a little longer (reservationSlack)
	done     chan struct{} // closed when resolved, released or expired
}

func newCancelBook() *cancelBook {
	return &cancelBook{tombs: make(map[uint64]*tombEntry), reserved: make(map[uint64]*reservation), min: math.MaxUint64}
}

// lookup returns seq's tombstone or its reservation, if any.
func (b *cancelBook) lookup(seq uint64) (t index.Tombstone, tombstoned bool, r *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.tombs[seq]; ok {
		return e.t, true, nil
	}
	return index.Tombstone{}, false, b.reserved[seq]
}

// cancelled reports whether seq has a tombstone.
func (b *cancelBook) cancelled(seq uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.tombs[seq]
	return ok
}

// reserve reserves seq for a cancel whose I/O ends by deadline. The caller
// (the scanner's goroutine) has checked that seq is free and not passed.
func (b *cancelBook) reserve(seq uint64, deadline time.Time) *reservation {
	r := &reservation{seq: seq, deadline: deadline, done: make(chan struct{})}
	b.mu.Lock()
	b.reserved[seq] = r
	b.mu.Unlock()
	return r
}

// resolve turns r into the tombstone t (cancelled) and reports true, or
// reports false if r has expired (the scanner passed the sequence: it is
// delivered).
func (b *cancelBook) resolve(r *reservation, t index.Tombstone) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved[r.seq] != r {
		return false
	}
	delete(b.reserved, r.seq)
	b.tombs[t.Seq] = &tombEntry{t: t}
	b.min = min(b.min, t.Seq)
	close(r.done)
	return true
}

// release ends r without a tombstone: the message is delivered as usual.
// It does nothing if r has ended already.
func (b *cancelBook) release(r *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved[r.seq] == r {
		delete(b.reserved, r.seq)
		close(r.done)
	}
}

// expire ends r for the scanner, which waited past its deadline, and
// reports whether it was still open: a tombstone written after that is not
// taken (see [cancelBook.resolve]).
func (b *cancelBook) expire(r *reservation) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved[r.seq] != r {
		return false
	}
	delete(b.reserved, r.seq)
	close(r.done)
	return true
}

// reset forgets every tombstone (reservations stay: their cancels are in
// flight), before the level's tombstones are loaded again.
func (b *cancelBook) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.tombs)
	b.min = math.MaxUint64
}

// load adds a tombstone read from [index.CancelStream]; whether its index
// records are written is unknown, so the janitor checks.
func (b *cancelBook) load(t index.Tombstone) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tombs[t.Seq] = &tombEntry{t: t}
	b.min = min(b.min, t.Seq)
}

// markIndexed records that seq's "cancelled" index records are written.
func (b *cancelBook) markIndexed(seq uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.tombs[seq]; ok {
		e.indexed = true
	}
}

// retiree is a tombstone handed to the janitor.
type retiree struct {
	t       index.Tombstone
	indexed bool
	// from is the tombstones stream to delete it from: the handing
	// owner's (set as it hands it over; the book leaves it nil).
	from jetstream.Stream
}

// drop offers hand the tombstones at or below acked (the acknowledged
// offset) that are not with the janitor yet; hand reports whether it took
// one (false: the janitor is behind, offered again next time).
func (b *cancelBook) drop(acked uint64, hand func(retiree) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if acked < b.min {
		return
	}
	b.min = math.MaxUint64
	for seq, e := range b.tombs {
		if seq <= acked && !e.dropping && hand(retiree{t: e.t, indexed: e.indexed}) {
			e.dropping = true
			continue
		}
		if !e.dropping {
			b.min = min(b.min, seq)
		}
	}
}

// retired records the janitor's outcome for seq: deleted (ok), or to be
// offered again.
func (b *cancelBook) retired(seq uint64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, found := b.tombs[seq]
	switch {
	case !found:
	case ok:
		delete(b.tombs, seq)
	default:
		e.dropping = false
		b.min = min(b.min, seq)
	}
}

// pendingTombs counts the tombstones of sequences above offset (cancelled,
// not passed by a committed offset) and returns the lowest keep of them,
// ascending.
func (b *cancelBook) pendingTombs(offset uint64, keep int) (n uint64, lowest []uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for seq := range b.tombs {
		if seq <= offset {
			continue
		}
		n++
		switch i, _ := slices.BinarySearch(lowest, seq); {
		case len(lowest) < keep:
			lowest = slices.Insert(lowest, i, seq)
		case i < len(lowest):
			lowest = slices.Insert(lowest[:len(lowest)-1], i, seq)
		}
	}
	return n, lowest
}
