package cancelapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// routedWait answers "has the router acked every ingress message published
// before this request?" for any number of concurrent cancel requests with
// one stream info at a time, not one poll loop per request. It owns one
// goroutine (run) and guards its waiters with one mutex.
//
// A waiter registered before a stream info was requested takes that info's
// last sequence as its bound: every message published before the waiter
// arrived is at or below it. The waiter is released once a later info shows
// the ingress stream (a work queue: acked messages leave it) empty, its first
// sequence past the bound, or holding no more messages than the invalid ones
// waiting for DELAYD_DLQ (waiting). Semantics are those of one request
// polling on its own, as docs/guide.md#cancel describes.
type routedWait struct {
	js      jetstream.JetStream
	waiting func() int // the router's invalid messages waiting for DELAYD_DLQ; they stay in ingress

	mu      sync.Mutex
	waiters []*routedWaiter
	gen     uint64        // stream infos requested so far
	wake    chan struct{} // a waiter arrived
}

type routedWaiter struct {
	gen  uint64 // gate.gen when it arrived: any info requested after it bounds it
	upTo uint64 // its bound; set by the first info requested after it arrived
	// at is that info's TimeStamp: the server's time, at or after the
	// waiter arrived.
	at   time.Time
	set  bool
	done chan error // receives nil once the router caught up, or the info's error
}

func newRoutedWait(js jetstream.JetStream, waiting func() int) *routedWait {
	return &routedWait{js: js, waiting: waiting, wake: make(chan struct{}, 1)}
}

// wait blocks until the router has acked every ingress message published
// before the call (true), until cancelWaitRouted has passed (false: the
// answer is not known yet), or until ctx is done (ctx's error). An error
// reading the ingress stream is returned as is.
func (g *routedWait) wait(ctx context.Context) (bool, error) {
	_, caughtUp, err := g.waitBound(ctx)
	return caughtUp, err
}

// waitBound is [routedWait.wait] that also returns the waiter's bound
// once the router caught up: the ingress stream's last sequence in the
// first stream info requested after the call (every message published
// before the call is at or below it).
func (g *routedWait) waitBound(ctx context.Context) (upTo uint64, caughtUp bool, err error) {
	w, caughtUp, err := g.await(ctx)
	return w.upTo, caughtUp, err
}

// waitNow is [routedWait.wait] that also returns the server's time of the
// first stream info requested after the call (its TimeStamp; this
// process's clock if the server sent none) once the router caught up:
// "now" for a request, by the server's clock (the reschedule API's).
func (g *routedWait) waitNow(ctx context.Context) (now time.Time, caughtUp bool, err error) {
	w, caughtUp, err := g.await(ctx)
	if caughtUp && w.at.IsZero() {
		w.at = time.Now()
	}
	return w.at, caughtUp, err
}

// await registers a waiter and waits as [routedWait.wait] says; the
// waiter's bound and time are set when caughtUp.
func (g *routedWait) await(ctx context.Context) (w *routedWaiter, caughtUp bool, err error) {
	w = &routedWaiter{done: make(chan error, 1)}
	g.mu.Lock()
	w.gen = g.gen
	g.waiters = append(g.waiters, w)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	timer := time.NewTimer(cancelWaitRouted)
	defer timer.Stop()
	select {
	case err := <-w.done:
		// settle set upTo and at before it sent on done.
		return w, err == nil, err
	case <-timer.C:
		g.drop(w)
		return &routedWaiter{}, false, nil
	case <-ctx.Done():
		g.drop(w)
		return &routedWaiter{}, false, ctx.Err()
	}
}

func (g *routedWait) drop(w *routedWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, x := range g.waiters {
		if x == w {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			return
		}
	}
}

// run serves the waiters until ctx is done: one stream info per round,
// rounds paced from 1 ms up to 100 ms while the router is behind.
func (g *routedWait) run(ctx context.Context) {
	pause := time.Millisecond
	for {
		g.mu.Lock()
		n := len(g.waiters)
		g.gen++
		gen := g.gen
		g.mu.Unlock()
		if n == 0 {
			pause = time.Millisecond
			select {
			case <-ctx.Done():
				return
			case <-g.wake:
				continue
			}
		}
		st, at, err := g.info(ctx)
		if ctx.Err() != nil {
			return
		}
		released := g.settle(gen, st, at, err)
		if released {
			pause = time.Millisecond
			continue // the others got their bound from this info: look again at once
		}
		pause = min(2*pause, 100*time.Millisecond)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}

// info reads the ingress stream's state, and the server's time of the
// read (the info's TimeStamp).
func (g *routedWait) info(ctx context.Context) (jetstream.StreamState, time.Time, error) {
	ictx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	stream, err := g.js.Stream(ictx, resource.IngressStream)
	if err != nil {
		return jetstream.StreamState{}, time.Time{}, fmt.Errorf("ingress stream: %w", err)
	}
	info := stream.CachedInfo()
	return info.State, info.TimeStamp, nil
}

// settle applies one stream info, requested in round gen and gathered by
// the server at at, to the waiters:
// it bounds those that arrived before the round and releases those whose
// bound the router has passed. It reports whether any waiter was released
// or bounded.
func (g *routedWait) settle(gen uint64, st jetstream.StreamState, at time.Time, err error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := false
	keep := g.waiters[:0]
	for _, w := range g.waiters {
		switch {
		case w.gen >= gen:
			// Arrived after this info was requested: not bounded by it.
		case err != nil:
			w.done <- err
			changed = true
			continue
		case !w.set:
			w.upTo, w.at, w.set = st.LastSeq, at, true
			changed = true
		}
		if w.set && err == nil && (st.Msgs == 0 || st.FirstSeq > w.upTo || st.Msgs <= uint64(g.waiting())) {
			w.done <- nil
			changed = true
			continue
		}
		keep = append(keep, w)
	}
	clear(g.waiters[len(keep):])
	g.waiters = keep
	return changed
}
