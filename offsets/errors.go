package offsets

import "errors"

// Sentinel errors of [Store]. Returned errors wrap one of these, so match them
// with [errors.Is].
var (
	// ErrNotFound is returned by [Store.Load] when no offset was ever
	// committed for the stream.
	ErrNotFound = errors.New("offsets: no committed offset")

	// ErrDeleted is wrapped, together with [ErrNotFound], by [Store.Load]'s
	// error when the stream's key was deleted or purged: its last entry in
	// the bucket is a KV delete or purge marker, so an offset was committed
	// once and then removed by hand. The wrapping error gives the marker's
	// revision and time.
	ErrDeleted = errors.New("offsets: committed offset was deleted")

	// ErrCorrupt is returned by [Store.Load] when the stored value is not a
	// decimal sequence. The value is quoted in the wrapping error.
	ErrCorrupt = errors.New("offsets: stored offset is not a decimal sequence")

	// ErrRegress is returned by [Store.Commit] when the offset would move
	// backwards. Offsets only move forward; use [Store.Correct] to repair one.
	ErrRegress = errors.New("offsets: offset would move backwards")

	// ErrFenced is returned by a fenced commit ([CommitterConfig.Fenced])
	// and by [Store.Bump] when the offset key's revision is no longer the
	// one expected: another owner wrote it (a new owner's bump). It wraps
	// the server's wrong-last-sequence error (jetstream's
	// ErrKeyRevisionMismatch). The committer writes nothing more: this
	// replica no longer owns the level stream.
	ErrFenced = errors.New("offsets: offset key written by another owner (fenced)")
)
