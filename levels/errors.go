package levels

import "errors"

// Errors from [Parse] and [ParseDuration] (the table), and from [Table.Pick] (a Delay-Level value). Returned errors
// wrap one of these, so match them with [errors.Is].
var (
	// ErrEmptyTable means the table text holds no durations.
	ErrEmptyTable = errors.New("empty level table")
	// ErrBadDuration means a duration does not parse, or is not a valid level delay (> 0, whole milliseconds).
	ErrBadDuration = errors.New("bad duration")
	// ErrNotIncreasing means a level's delay is smaller than the one before it.
	ErrNotIncreasing = errors.New("levels not strictly increasing")
	// ErrDuplicate means two levels have the same delay, whether spelled the same ("1s 1s") or not ("90s 1m30s").
	ErrDuplicate = errors.New("duplicate level")
	// ErrBadPartitions means a partition list ([ParsePartitions]) does not parse, names a level twice, gives a count
	// outside 1 to [PartitionsMax], or ([Partitions.Check]) names a delay that is not a level of the table.
	ErrBadPartitions = errors.New("bad partitions")

	// ErrMissingLevel means the Delay-Level value is empty or only whitespace.
	ErrMissingLevel = errors.New("missing delay level")
	// ErrInvalidLevel means the Delay-Level value is not a base-10 integer, or is negative: a bad level only (the
	// router has errors of its own for Delay-Duration, Delay-Deliver-At and Delay-Merge-Key values).
	ErrInvalidLevel = errors.New("invalid delay level")
	// ErrLevelOverflow means the Delay-Level value is an integer that does not fit in an int64.
	ErrLevelOverflow = errors.New("delay level overflows int64")
)
