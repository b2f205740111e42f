package cancelapi

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The cancel API's errors (deliver re-exports both: the same values).
var (
	// ErrRouterBehind is a cancel's error when the router has not placed the
	// messages published before it within 25 s: the answer is not known yet.
	// The request may be sent again. The cancel API answers it with code
	// [contract.CancelStatusRouterBehind].
	ErrRouterBehind = errors.New("the router has not yet placed every message published before this cancel; try again")

	// ErrAmbiguousID is a cancel's error for a decimal id that is both a
	// publisher's Nats-Msg-Id and an ingress sequence delayd knows: "seq:N"
	// or "id:N" says which. The cancel API answers it with code
	// [contract.CancelStatusBadRequest].
	ErrAmbiguousID = errors.New("ambiguous id")
)

func ambiguous(id string) error {
	return fmt.Errorf("%w %q: it names two messages (a publisher's Nats-Msg-Id, and an ingress sequence or a prefixed id); send seq:N for ingress sequence N, id:X for the publisher's id X", ErrAmbiguousID, id)
}

// sleepCtx waits d, or until ctx is done (its error). jswire and level
// keep copies of their own (jswire.sleepCtx, level.sleepWake).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
