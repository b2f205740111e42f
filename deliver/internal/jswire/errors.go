package jswire

import "errors"

var (
	// ErrConsumerDeleted is returned by [Pull.Next] when the server deleted
	// the pull consumer (status 409 "Consumer Deleted") or no server answers
	// its pull requests (status 503, no responders: the consumer is gone).
	ErrConsumerDeleted = errors.New("consumer deleted")

	// ErrNoHeartbeat is returned by [Pull.Next], with
	// [Pull.FailUnanswered], when neither its requests nor the requests
	// asked again after twice [PullHeartbeat] of silence got a message or a
	// heartbeat: the consumer's server may hang.
	ErrNoHeartbeat = errors.New("no heartbeat from the consumer's server")

	// ErrWoken is returned by [Pull.Next] when its wake channel received.
	ErrWoken = errors.New("woken")
)
