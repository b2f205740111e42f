package level

// The Service's reads of a level's state. They replace deliver's direct
// reads of the scanner's fields (step L1 of
// docs/reshape.md#6-steps-in-order), on top of the term slot (L2); L3
// replaces them with [Owners].

// Stream returns the level stream's name.
func (s *Level) Stream() string { return s.cfg.Stream }

// Owned reports whether this replica runs the level as its owner now (a
// term of its lease is running): the term slot holds an owner.
func (s *Level) Owned() bool { return s.slot.get() != nil }

// Loaded reports whether the current term's load loaded the offset and
// the tombstones (after its bump): from then on [local.Pending] answers
// for this replica's view of the level. False between terms.
func (s *Level) Loaded() bool {
	o := s.slot.get()
	return o != nil && o.view.ready.done()
}

// Passed returns the highest sequence the current term's owner handed off
// (delivered, forwarded, skipped); 0 between terms.
func (s *Level) Passed() uint64 {
	if o := s.slot.get(); o != nil {
		return o.view.passed.Load()
	}
	return 0
}

// Committed returns the offset this replica's owner of the level last
// committed, and whether a term of the level runs here now: 0 and false
// for a level this replica does not own (read its stored offset). It reads
// published state only (the term slot and the committer's atomic), never
// asking another replica.
func (s *Level) Committed() (offset uint64, owned bool) {
	if s.slot.get() == nil {
		return 0, false
	}
	return s.commits.Committed(), true
}

// PendingTombs counts the cancel book's tombstones of sequences past the
// committed offset and returns the lowest keep of them, ascending.
func (s *Level) PendingTombs(keep int) (n uint64, lowest []uint64) {
	return s.cancel.book.pendingTombs(s.commits.Committed(), keep)
}

// Cancelled reports whether the cancel book holds a tombstone of seq (for
// deliver's tests of the cancel paths).
func (s *Level) Cancelled(seq uint64) bool { return s.cancel.book.cancelled(seq) }

// String returns a's word on the decide subject ("cancelled",
// "delivered", …); "" for no answer of the decide subject's.
func (a CancelAnswer) String() string { return answerText[a] }

// The decide subject's answers to the pending question (its wire format,
// for deliver's tests of it).
const (
	ReplyPending    = decidePending
	ReplyNotPending = decideNotPending
)
