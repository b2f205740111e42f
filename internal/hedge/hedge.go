// Package hedge bounds reads that any replica of a JetStream stream may
// answer. A direct get ($JS.API.DIRECT.GET, and a KV bucket's Get, which
// uses it) goes to one server of the stream's replicas, picked by the
// cluster; a server that hangs (SIGSTOP, a stalled disk, a half-open
// network) still counts as one and never answers. So a read not answered
// within [After] is sent again, and the first answer of any try wins
// (docs/operations.md#what-each-failure-costs). A try that ends in a timeout while
// the caller's context lives is no answer; any other error is.
package hedge

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// After is how long a read waits for an answer before it is sent again.
// A live server answers a direct get within milliseconds, within a few
// hundred on a loaded machine.
const After = 500 * time.Millisecond

// AfterLeader is how long a request only a stream's leader answers (stream
// info, a message get) waits before it is sent again: a leader that hangs
// never answers, and the request sent again reaches the new leader once
// JetStream has elected one, instead of waiting out the caller's whole
// timeout.
const AfterLeader = time.Second

// MaxTries bounds the tries of one read (the first and its resends).
const MaxTries = 8

// Do calls fn, and calls it again every after while no call has answered
// (up to [MaxTries] calls), each with a context that ends when Do returns;
// it returns the first answer: a result, or an error that is no timeout
// ([IsTimeout]). When ctx ends first, it returns ctx's error, or the last
// timeout if every try timed out.
func Do[T any](ctx context.Context, after time.Duration, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		v   T
		err error
	}
	answers := make(chan answer, MaxTries) // buffered: a late try never blocks
	try := func() {
		v, err := fn(ctx)
		answers <- answer{v, err}
	}
	go try()
	tries, running := 1, 1
	timer := time.NewTimer(after)
	defer timer.Stop()
	var zero T
	var last error
	for {
		select {
		case a := <-answers:
			running--
			if a.err == nil || !IsTimeout(a.err) {
				return a.v, a.err
			}
			last = a.err
			if ctx.Err() != nil {
				return zero, last
			}
			if running == 0 && tries < MaxTries {
				// Every try timed out on its own (a shorter timeout
				// inside fn): try again at once.
				tries++
				running++
				go try()
				timer.Reset(after)
			} else if running == 0 {
				return zero, last
			}
		case <-timer.C:
			if tries < MaxTries {
				tries++
				running++
				go try()
				timer.Reset(after)
			}
		case <-ctx.Done():
			if last != nil {
				return zero, last
			}
			return zero, ctx.Err()
		}
	}
}

// IsTimeout reports whether err is a request's timeout: no answer, rather
// than an answer that is an error.
func IsTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.Canceled)
}

// KV returns kv with its Get hedged by [Do] (with [After]): a KV bucket
// reads a key by direct get, which any replica may answer. Every other
// method is kv's own: writes and watches go to the stream's leader.
func KV(kv jetstream.KeyValue) jetstream.KeyValue {
	if _, ok := kv.(hedgedKV); ok {
		return kv
	}
	return hedgedKV{kv}
}

// hedgedKV is a KeyValue whose Get is hedged.
type hedgedKV struct{ jetstream.KeyValue }

// Get is jetstream.KeyValue's Get, hedged.
func (h hedgedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	return Do(ctx, After, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return h.KeyValue.Get(ctx, key) })
}
