package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// cancelCounts is what a cancel storm's requests were answered.
type cancelCounts struct {
	Offered          int `json:"offered"`           // requests sent
	Cancelled        int `json:"cancelled"`         // answered "cancelled"
	NotFound         int `json:"not_found"`         // answered "not found"
	AlreadyDelivered int `json:"already_delivered"` // answered "already delivered"
	Busy             int `json:"busy"`              // answered busy (429) at once: the queue was full
	Errors           int `json:"errors"`            // answered "error: …" otherwise
	Unanswered       int `json:"unanswered"`        // no reply within 30 s of the end
	// Both counts messages answered "cancelled" and delivered anyway: a
	// broken guarantee, always 0.
	Both int `json:"cancelled_and_delivered"`
}

// cancelStorm runs the steady workload (the first of -steady-rates msg/s for
// -steady-duration, each due 1 s after it is published, table "1s", every
// message with a Nats-Msg-Id) twice, each on a fresh server: without
// cancels, then with -cancel-rate cancel requests per second at the same
// level for the same duration. The cancels target a mix, by request
// number: a quarter unknown ids (not found), a quarter messages published
// 2 to 2.5 s before (due and delivered by then: already delivered), half
// messages published in the last 250 ms (pending: most answer cancelled).
// Each row counts lost (published, not delivered, and not answered
// "cancelled") and early; the "with" row carries the answers and
// p99_ratio = its lateness p99 / the "without" row's.
func (b *bench) cancelStorm(ctx context.Context) ([]result, []string, error) {
	off, err := b.cancelStormRun(ctx, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("without cancels: %w", err)
	}
	on, err := b.cancelStormRun(ctx, b.cfg.CancelRate)
	if err != nil {
		return []result{off}, nil, fmt.Errorf("with cancels: %w", err)
	}
	var notes []string
	if off.Lateness != nil && on.Lateness != nil && off.Lateness.P99 > 0 {
		r := on.Lateness.P99 / off.Lateness.P99
		on.P99Ratio = &r
		notes = append(notes, fmt.Sprintf("cancel-storm: lateness p99 with %d cancels/s / without = %.2f (issue 11's target: ≤ 2)", b.cfg.CancelRate, r))
	}
	return []result{off, on}, notes, nil
}

// cancelStormRun is one run of the cancel storm with rate cancels/s (0:
// none).
func (b *bench) cancelStormRun(ctx context.Context, rate int) (result, error) {
	row := result{Scenario: "cancel-storm-off", System: "delayd", Target: "core"}
	if rate > 0 {
		row.Scenario = "cancel-storm"
	}
	e, err := b.newEnv()
	if err != nil {
		return row, err
	}
	defer e.close()
	svc, err := e.startService(ctx, "1s")
	if err != nil {
		return row, err
	}
	rate0 := b.cfg.SteadyRates[0]
	core, err := e.subscribe("storm.core", b.steadyTotal(rate0))
	if err != nil {
		return row, err
	}
	var published atomic.Int64
	var storm *stormer
	stormDone := make(chan error, 1)
	stopStorm := make(chan struct{})
	if rate > 0 {
		if storm, err = newStormer(e, rate, rate0); err != nil {
			return row, err
		}
		go func() { stormDone <- storm.run(ctx, func() int { return int(published.Load()) }, stopStorm) }()
	}
	p, err := b.publishPaced(ctx, e, row.Scenario+" delayd", rate0, func(i int) *nats.Msg {
		m := b.delaydMsg(i, "storm.core", 1)
		m.Header.Set("Nats-Msg-Id", stormID(i))
		published.Store(int64(i + 1))
		return m
	})
	close(stopStorm)
	if rate > 0 {
		if serr := <-stormDone; err == nil && serr != nil {
			err = serr
		}
	}
	if err != nil {
		return row, err
	}
	cancelled := map[int]bool{}
	if storm != nil {
		b.waitCount(ctx, row.Scenario+" delayd: cancels answered", storm.offered(), 30*time.Second, storm.answered)
		cancelled = storm.cancelledSet()
	}
	b.waitCount(ctx, row.Scenario+" delayd: delivered", p.sent-len(cancelled), time.Minute, core.count)
	// A delivery of a cancelled message (there must be none) arrives in
	// sequence order with the rest, before the last one counted here.
	if err := svc.stop(); err != nil {
		return row, err
	}
	arrs := core.arrivals()
	t := count(arrs, p.sent, func(a arrival) time.Time { return a.due })
	delivered := make(map[int]bool, len(arrs))
	for _, a := range arrs {
		delivered[a.idx] = true
	}
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	if storm != nil {
		c := storm.counts()
		for idx := range cancelled {
			if delivered[idx] {
				c.Both++
			} else if idx < p.sent {
				row.Lost-- // cancelled, as answered: not lost
			}
		}
		row.Cancels = &c
		row.Note = fmt.Sprintf("%d cancels/s offered: %d sent, %d cancelled, %d not found, %d already delivered, %d busy, %d errors, %d unanswered, %d cancelled and delivered",
			rate, c.Offered, c.Cancelled, c.NotFound, c.AlreadyDelivered, c.Busy, c.Errors, c.Unanswered, c.Both)
	} else {
		row.Note = "no cancels"
	}
	row.Note = notes(row.Note, refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, nil
}

// stormID is message i's Nats-Msg-Id.
func stormID(i int) string { return "storm-" + strconv.Itoa(i) }

// stormer sends paced cancel requests to delayd's unscoped cancel subject
// and records the replies, on a connection of its own.
type stormer struct {
	nc      *nats.Conn
	inbox   string
	rate    int // cancels/s
	msgRate int // the level's msg/s, to pick targets by age

	mu      sync.Mutex
	targets []int          // request k's message index; -1 for an unknown id
	replies map[int]string // request k's reply
	status  map[int]string // request k's Delay-Status
}

func newStormer(e *env, rate, msgRate int) (*stormer, error) {
	nc, err := e.conn(nil)
	if err != nil {
		return nil, err
	}
	s := &stormer{nc: nc, inbox: nats.NewInbox(), rate: rate, msgRate: msgRate, replies: map[int]string{}, status: map[int]string{}}
	sub, err := nc.Subscribe(s.inbox+".*", func(m *nats.Msg) {
		k, err := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
		if err != nil {
			return
		}
		s.mu.Lock()
		s.replies[k] = string(m.Data)
		s.status[k] = m.Header.Get(contract.HeaderStatus)
		s.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	return s, nc.Flush()
}

// run sends rate requests per second, in batches every 5 ms, until stop is
// closed; published reports how many messages were published so far.
func (s *stormer) run(ctx context.Context, published func() int, stop <-chan struct{}) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	k := 0
	for {
		want := int(float64(s.rate) * time.Since(start).Seconds())
		for ; k < want; k++ {
			idx := s.pick(k, published())
			id := "no-such-" + strconv.Itoa(k)
			if idx >= 0 {
				id = stormID(idx)
			}
			s.mu.Lock()
			s.targets = append(s.targets, idx)
			s.mu.Unlock()
			if err := s.nc.PublishMsg(&nats.Msg{Subject: contract.CancelSubject, Reply: s.inbox + "." + strconv.Itoa(k), Data: []byte(id)}); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return s.nc.Flush()
		case <-tick.C:
		}
	}
}

// pick chooses request k's message by k mod 4: 0 none (an unknown id), 1
// one published 2 to 2.5 s ago (delivered), 2 and 3 one published in the
// last 250 ms (pending). -1 means an unknown id.
func (s *stormer) pick(k, published int) int {
	var idx int
	switch k % 4 {
	case 0:
		return -1
	case 1:
		idx = published - 2*s.msgRate - rand.IntN(s.msgRate/2+1)
	default:
		idx = published - 1 - rand.IntN(s.msgRate/4+1)
	}
	if idx < 0 {
		return -1
	}
	return idx
}

func (s *stormer) offered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.targets)
}

func (s *stormer) answered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.replies)
}

// cancelledSet is the messages answered "cancelled".
func (s *stormer) cancelledSet() map[int]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]bool{}
	for k, r := range s.replies {
		if r == contract.CancelReplyCancelled && s.targets[k] >= 0 {
			out[s.targets[k]] = true
		}
	}
	return out
}

func (s *stormer) counts() cancelCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := cancelCounts{Offered: len(s.targets), Unanswered: len(s.targets) - len(s.replies)}
	for k, r := range s.replies {
		switch {
		case s.status[k] == strconv.Itoa(contract.CancelStatusBusy):
			c.Busy++
		case r == contract.CancelReplyCancelled:
			c.Cancelled++
		case r == contract.CancelReplyNotFound:
			c.NotFound++
		case r == contract.CancelReplyDelivered:
			c.AlreadyDelivered++
		default:
			c.Errors++
		}
	}
	return c
}
