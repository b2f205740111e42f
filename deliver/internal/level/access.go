package level

// The Service's reads of a level's state. They replace deliver's direct
// reads of the scanner's fields (step L1 of
// docs/reshape.md#6-steps-in-order); L2 and L3 replace them with the
// term slot and [Owners].

// Stream returns the level stream's name.
func (s *Level) Stream() string { return s.cfg.Stream }

// Owned reports whether this replica runs the level as its owner now (a
// term of its lease is running).
func (s *Level) Owned() bool { return s.run.owned.Load() }

// Loaded reports whether the current start loaded the offset and the
// tombstones (in a term: after its bump): from then on [Level.PendingAt]
// answers for this replica's view of the level.
func (s *Level) Loaded() bool { return s.run.decides.Load() }

// Passed returns the highest sequence handed off (delivered, forwarded,
// skipped).
func (s *Level) Passed() uint64 { return s.run.passed.Load() }

// Committed returns the offset the level last committed.
func (s *Level) Committed() uint64 { return s.commits.Committed() }

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
