package level

import "errors"

// ErrCancelBusy is the cancel API's answer (code 429,
// [contract.CancelStatusBusy]) to a request that arrives while the cancel
// queue is full: it is answered at once, not looked at, so a storm of
// cancels gets prompt answers instead of timeouts and costs the deliveries
// nothing. Try again after a pause. deliver re-exports it.
var ErrCancelBusy = errors.New("busy: too many cancel requests waiting; try again")

// errReconnected is a core delivery's outcome when the flush that was to
// confirm it spans a reconnect: it may have been lost with the old
// connection, so it is delivered again.
var errReconnected = errors.New("the connection was re-established since the publish; delivering again")
