package lease

import "errors"

// Sentinel errors. Returned errors and [Lease.Context] causes wrap one of
// these, so match them with [errors.Is].
var (
	// ErrExpired ends a term whose fence passed: no renewal was stored for
	// TTL - margin after the last one was sent.
	ErrExpired = errors.New("lease: expired")

	// ErrLost ends a term at once when a renewal's compare-and-set failed:
	// another replica wrote the key. It wraps jetstream's
	// ErrKeyRevisionMismatch.
	ErrLost = errors.New("lease: lost to another holder")

	// ErrReleased ends a term given up by [Lease.Release].
	ErrReleased = errors.New("lease: released")

	// ErrNotHeld is the cause of [Lease.Context]'s context when no term is
	// held.
	ErrNotHeld = errors.New("lease: not held")

	// ErrCorrupt is returned by [DecodeValue] for a value that is not a
	// lease value of a known version.
	ErrCorrupt = errors.New("lease: value is not a lease value")

	// ErrMismatch is wrapped by [MismatchError]: a live replica's
	// setting (its level table) differs from this one's.
	ErrMismatch = errors.New("lease: settings differ from a live replica's")
)
