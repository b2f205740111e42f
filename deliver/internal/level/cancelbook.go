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
// A sequence is in at most one of these states here (bookState): free,
// reserved (a cancel or a move is writing its tombstone: the scanner does
// not pass it until the reservation is resolved, released or expired),
// cancelled (a cancel's tombstone: the scanner skips it), moving (a move's
// intent is stored, its new message not known to be: the scanner holds it,
// and it never expires) or moved (the new message is stored: the scanner
// skips it). Moving becomes moved (placed) or free again (void);
// docs/pending.md#23-the-book-and-the-loop.
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
	indexed  bool       // its "cancelled" index records are written (a cancel's)
	dropping bool       // handed to the janitor
	move     *moveState // a move's intent (t.Move set); nil for a cancel's tombstone
}

// moveState is a move's progress past its intent.
type moveState struct {
	placed bool          // its new message is stored: the old one is skipped
	markAt uint64        // its placed mark's sequence in index.CancelStream; 0 if none is known
	done   chan struct{} // closed when placed or voided: a held head is looked at again
}

// bookState is what the book holds of one sequence.
type bookState int

const (
	stateFree      bookState = iota // nothing: delivered as usual
	stateReserved                   // a cancel or a move writes its tombstone
	stateCancelled                  // a cancel's tombstone: skipped
	stateMoving                     // a move's intent, its new message not known stored: held
	stateMoved                      // a move whose new message is stored: skipped
)

// entryState is e's state.
func (e *tombEntry) state() bookState {
	switch {
	case e.move == nil:
		return stateCancelled
	case e.move.placed:
		return stateMoved
	}
	return stateMoving
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

// cancelled reports whether seq has a tombstone (a cancel's or a move's
// intent: either way it is not delivered at this place).
func (b *cancelBook) cancelled(seq uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.tombs[seq]
	return ok
}

// state returns seq's state, its tombstone (cancelled, moving, moved) and
// its reservation (reserved).
func (b *cancelBook) state(seq uint64) (bookState, index.Tombstone, *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.tombs[seq]; ok {
		return e.state(), e.t, nil
	}
	if r := b.reserved[seq]; r != nil {
		return stateReserved, index.Tombstone{}, r
	}
	return stateFree, index.Tombstone{}, nil
}

// moving returns the channel closed when seq's move is placed or voided;
// nil if seq is not moving.
func (b *cancelBook) moving(seq uint64) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.tombs[seq]; ok && e.state() == stateMoving {
		return e.move.done
	}
	return nil
}

// resolveMove turns r into the move whose intent t (t.Move set) is
// stored: seq is moving, held by the scanner until placed or void. It
// reports false if r has expired (the scanner passed the sequence: it is
// delivered, and the intent must be deleted).
func (b *cancelBook) resolveMove(r *reservation, t index.Tombstone) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved[r.seq] != r {
		return false
	}
	delete(b.reserved, r.seq)
	b.tombs[t.Seq] = &tombEntry{t: t, move: &moveState{done: make(chan struct{})}}
	b.min = min(b.min, t.Seq)
	close(r.done)
	return true
}

// placed records that the new message of seq's move is stored, and its
// placed mark at markAt (0 if not written yet): seq is moved, and skipped.
// It reports whether seq is a move of the intent at intentAt (a newer
// tombstone of seq, or none, reports false: the mark names another).
func (b *cancelBook) placed(seq, intentAt, markAt uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.tombs[seq]
	if !ok || e.move == nil || e.t.At != intentAt {
		return false
	}
	if markAt != 0 {
		e.move.markAt = markAt
	}
	if !e.move.placed {
		e.move.placed = true
		close(e.move.done)
	}
	return true
}

// void drops seq's move of the intent at intentAt, not placed: seq is
// free again and delivered as usual (its intent deleted by the caller).
// It reports false, doing nothing, if seq is not that move or is placed.
func (b *cancelBook) void(seq, intentAt uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.tombs[seq]
	if !ok || e.state() != stateMoving || e.t.At != intentAt {
		return false
	}
	delete(b.tombs, seq)
	close(e.move.done)
	return true
}

// movingAbove returns the intents of the moving sequences above offset.
func (b *cancelBook) movingAbove(offset uint64) []index.Tombstone {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []index.Tombstone
	for seq, e := range b.tombs {
		if seq > offset && e.state() == stateMoving {
			out = append(out, e.t)
		}
	}
	return out
}

// intentOf returns the sequence moved by the intent stored at at in
// index.CancelStream (the one a placed mark names); ok false if no move
// in the book is that intent.
func (b *cancelBook) intentOf(at uint64) (seq uint64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s, e := range b.tombs {
		if e.move != nil && e.t.At == at {
			return s, true
		}
	}
	return 0, false
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

// load adds a tombstone read from [index.CancelStream], a move's intent
// (moving) if t.Move is set; whether a cancel's index records are written
// is unknown, so the janitor checks. Of several tombstones of one
// sequence the newest (highest At) is kept: an older one was written by
// an owner whose term ended before it confirmed it (an orphan,
// docs/pending.md#25-safety-delivered-once-at-the-old-due-or-once-at-the-new-one).
func (b *cancelBook) load(t index.Tombstone) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.tombs[t.Seq]; ok && e.t.At > t.At {
		return
	}
	e := &tombEntry{t: t}
	if !t.Move.IsZero() {
		e.move = &moveState{done: make(chan struct{})}
	}
	b.tombs[t.Seq] = e
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
	// move: t is a move's intent, not a cancel: no "cancelled" index
	// records (its new placement is the latest record); markAt is its
	// placed mark's sequence, deleted with it (0: none known).
	move   bool
	markAt uint64
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
		rt := retiree{t: e.t, indexed: e.indexed, move: e.move != nil}
		if e.move != nil {
			rt.markAt = e.move.markAt
		}
		if seq <= acked && !e.dropping && hand(rt) {
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
		if e.state() == stateMoving {
			close(e.move.done) // a loaded intent the offset passed: nobody holds it
		}
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
