package cancelapi

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// routedWait answers "has the router acked every ingress message published
// before this request?" for any number of concurrent cancel requests with
// one stream info at a time, not one poll loop per request. It owns one
// goroutine (run), the only one that reads or writes its waiters: a
// request arrives through a [routedAsk] (a channel into run), so no lock
// guards them.
//
// A waiter that arrived before a stream info was requested takes that
// info's last sequence as its bound: every message published before the
// waiter arrived is at or below it. The waiter is released once a later
// info shows the ingress stream (a work queue: acked messages leave it)
// empty, its first sequence past the bound, or holding no more messages
// than the invalid ones waiting for DELAYD_DLQ (waiting). Semantics are
// those of one request polling on its own, as docs/guide.md#cancel
// describes.
type routedWait struct {
	js      jetstream.JetStream // immutable
	waiting func() int          // immutable: the router's invalid messages waiting for DELAYD_DLQ; they stay in ingress
	arrive  chan *routedWaiter  // immutable: a request's waiter, received by run

	waiters []*routedWaiter // run's only
	gen     uint64          // run's only: stream infos requested so far
}

// routedAsk is the workers' side of a [routedWait]: the channel into its
// goroutine, never written after newRoutedWait, so any goroutine may ask.
type routedAsk struct{ arrive chan<- *routedWaiter }

type routedWaiter struct {
	gen  uint64 // run's only: routedWait.gen when run took it: any info requested after it bounds it
	upTo uint64 // run's only: its bound; set by the first info requested after it arrived
	// at is run's only: that info's TimeStamp, the server's time at or
	// after the waiter arrived.
	at   time.Time
	set  bool              // run's only
	gone atomic.Bool       // the request stopped waiting (its wait passed, or its ctx ended): run drops it
	done chan routedAnswer // receives the answer once the router caught up, or the info's error
}

// routedAnswer is run's answer to a waiter, sent on its done channel: the
// waiter's bound and that info's time once the router caught up, or the
// error reading the ingress stream.
type routedAnswer struct {
	upTo uint64
	at   time.Time
	err  error
}

func newRoutedWait(js jetstream.JetStream, waiting func() int) *routedWait {
	return &routedWait{js: js, waiting: waiting, arrive: make(chan *routedWaiter)}
}

// ask returns the workers' side of g.
func (g *routedWait) ask() routedAsk { return routedAsk{arrive: g.arrive} }

// wait blocks until the router has acked every ingress message published
// before the call (true), until cancelWaitRouted has passed (false: the
// answer is not known yet), or until ctx is done (ctx's error). An error
// reading the ingress stream is returned as is.
func (g routedAsk) wait(ctx context.Context) (bool, error) {
	_, caughtUp, err := g.waitBound(ctx)
	return caughtUp, err
}

// waitBound is [routedAsk.wait] that also returns the waiter's bound
// once the router caught up: the ingress stream's last sequence in the
// first stream info requested after the call (every message published
// before the call is at or below it).
func (g routedAsk) waitBound(ctx context.Context) (upTo uint64, caughtUp bool, err error) {
	a, caughtUp, err := g.await(ctx)
	return a.upTo, caughtUp, err
}

// waitNow is [routedAsk.wait] that also returns the server's time of the
// first stream info requested after the call (its TimeStamp; this
// process's clock if the server sent none) once the router caught up:
// "now" for a request, by the server's clock (the reschedule API's).
func (g routedAsk) waitNow(ctx context.Context) (now time.Time, caughtUp bool, err error) {
	a, caughtUp, err := g.await(ctx)
	if caughtUp && a.at.IsZero() {
		a.at = time.Now()
	}
	return a.at, caughtUp, err
}

// await hands a waiter to run and waits as [routedAsk.wait] says; run's
// answer (the bound and its time) is returned when caughtUp, a zero one
// otherwise.
func (g routedAsk) await(ctx context.Context) (routedAnswer, bool, error) {
	w := &routedWaiter{done: make(chan routedAnswer, 1)}
	timer := time.NewTimer(cancelWaitRouted)
	defer timer.Stop()
	// run takes it at once when idle, else before its next stream info:
	// the first info requested after the call, as a waiter's bound must be.
	select {
	case g.arrive <- w:
	case <-timer.C:
		return routedAnswer{}, false, nil
	case <-ctx.Done():
		return routedAnswer{}, false, ctx.Err()
	}
	select {
	case a := <-w.done:
		if a.err != nil {
			return routedAnswer{}, false, a.err
		}
		return a, true, nil
	case <-timer.C:
		w.gone.Store(true)
		return routedAnswer{}, false, nil
	case <-ctx.Done():
		w.gone.Store(true)
		return routedAnswer{}, false, ctx.Err()
	}
}

// take adds the waiters that arrived (without waiting for one) and drops
// those that stopped waiting.
func (g *routedWait) take() {
	for {
		select {
		case w := <-g.arrive:
			w.gen = g.gen
			g.waiters = append(g.waiters, w)
			continue
		default:
		}
		break
	}
	keep := g.waiters[:0]
	for _, w := range g.waiters {
		if !w.gone.Load() {
			keep = append(keep, w)
		}
	}
	clear(g.waiters[len(keep):])
	g.waiters = keep
}

// run serves the waiters until ctx is done: one stream info per round,
// rounds paced from 1 ms up to 100 ms while the router is behind.
func (g *routedWait) run(ctx context.Context) {
	pause := time.Millisecond
	for {
		g.take()
		n := len(g.waiters)
		g.gen++
		gen := g.gen
		if n == 0 {
			pause = time.Millisecond
			select {
			case <-ctx.Done():
				return
			case w := <-g.arrive:
				w.gen = g.gen
				g.waiters = append(g.waiters, w)
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
	changed := false
	keep := g.waiters[:0]
	for _, w := range g.waiters {
		switch {
		case w.gone.Load():
			// Stopped waiting: dropped, as it would have been at once.
			continue
		case w.gen >= gen:
			// Arrived after this info was requested: not bounded by it.
		case err != nil:
			w.done <- routedAnswer{err: err}
			changed = true
			continue
		case !w.set:
			w.upTo, w.at, w.set = st.LastSeq, at, true
			changed = true
		}
		if w.set && err == nil && (st.Msgs == 0 || st.FirstSeq > w.upTo || st.Msgs <= uint64(g.waiting())) {
			w.done <- routedAnswer{upTo: w.upTo, at: w.at}
			changed = true
			continue
		}
		keep = append(keep, w)
	}
	clear(g.waiters[len(keep):])
	g.waiters = keep
	return changed
}
