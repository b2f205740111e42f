package message

import "errors"

// The invalid-input and undeliverable sentinels, re-exported by package
// deliver (deliver/errors.go), where users match them with [errors.Is].
var (
	// ErrInvalidDelay means a message's Delay-Duration or Delay-Deliver-At
	// is invalid: not a Go duration or an RFC 3339 time, negative, beyond
	// the max delay (DELAYD_MAX_DELAY), given more than once, or given with
	// another delay header. Such a message is dead-lettered with reason
	// "level". Its text is "invalid delay level", the text those dead
	// letters' Delay-Error has always started with; it is kept so that
	// Delay-Error does not change.
	ErrInvalidDelay = errors.New("invalid delay level")

	// ErrInvalidMergeKey means a message's Delay-Merge-Key is empty or has
	// more than one value. Such a message is dead-lettered with reason
	// "level"; its text is "invalid delay level" for the same reason as
	// [ErrInvalidDelay].
	ErrInvalidMergeKey = errors.New("invalid delay level")

	// ErrTooLarge means a message no longer fits the server's max payload
	// once delayd's own headers are added. Such a message is dead-lettered
	// with reason "size".
	ErrTooLarge = errors.New("message too large")

	// ErrPermissionDenied means the server refused delayd's publish to the
	// target: delayd's NATS user may not publish there.
	ErrPermissionDenied = errors.New("permission denied")
)
