package jswire

import "errors"

var (
	// ErrConsumerDeleted is returned by [Pull.Next] when the server deleted
	// the pull consumer (status 409 "Consumer Deleted") or no server answers
	// its pull requests (status 503, no responders: the consumer is gone).
	ErrConsumerDeleted = errors.New("consumer deleted")

	// ErrWoken is returned by [Pull.Next] when its wake channel received.
	ErrWoken = errors.New("woken")
)
