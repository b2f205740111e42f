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

// rescheduleCounts is what a reschedule storm's requests were answered,
// and what the moved messages' deliveries showed.
type rescheduleCounts struct {
	Offered          int `json:"offered"`           // requests sent
	Rescheduled      int `json:"rescheduled"`       // answered "rescheduled"
	NotFound         int `json:"not_found"`         // answered "not found"
	AlreadyDelivered int `json:"already_delivered"` // answered "already delivered"
	Busy             int `json:"busy"`              // answered busy (429) at once: the queue was full
	Errors           int `json:"errors"`            // answered "error: …" otherwise
	Unanswered       int `json:"unanswered"`        // no reply within 30 s of the end
	// DeliveredAtOld counts messages answered "rescheduled" delivered
	// without Delay-Rescheduled (at their old place): a broken
	// guarantee, always 0.
	DeliveredAtOld int `json:"delivered_at_old"`
	// Both counts messages delivered with two different Delay-Due-At (at
	// the old place and the new): a broken guarantee, always 0.
	Both int `json:"both"`
}

// rescheduleStorm runs the steady workload (the first of -steady-rates
// msg/s for -steady-duration, each due 1 s after it is published, table
// "1s", every message with a Nats-Msg-Id) twice, each on a fresh server:
// without reschedules, then with -reschedule-rate reschedule requests per
// second at the same level for the same duration, by request number: a
// quarter unknown ids (not found), a quarter messages published 2 to 2.5 s
// before (already delivered), half messages published in the last 250 ms
// (pending: most answer rescheduled), of those half to 500 ms from the
// request (Delay-Deliver-At: earlier than their old due) and half run now
// (Delay-Duration: 0s). Each row counts lost (published, not delivered)
// and early (against the delivery's Delay-Due-At, the new due of a moved
// message); the "with" row carries the answers, delivered_at_old
// (answered rescheduled, delivered without Delay-Rescheduled) and both
// (delivered with two dues), each always 0, and p99_ratio = its lateness p99 / the "without" row's
// (issue 21's target: ≤ 2, as the cancel storm's).
func (b *bench) rescheduleStorm(ctx context.Context) ([]result, []string, error) {
	if b.cfg.RescheduleRate < 1 {
		return nil, nil, fmt.Errorf("-reschedule-rate %d: must be positive", b.cfg.RescheduleRate)
	}
	off, err := b.rescheduleStormRun(ctx, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("without reschedules: %w", err)
	}
	on, err := b.rescheduleStormRun(ctx, b.cfg.RescheduleRate)
	if err != nil {
		return []result{off}, nil, fmt.Errorf("with reschedules: %w", err)
	}
	var notes []string
	if off.Lateness != nil && on.Lateness != nil && off.Lateness.P99 > 0 {
		r := on.Lateness.P99 / off.Lateness.P99
		on.P99Ratio = &r
		notes = append(notes, fmt.Sprintf("reschedule-storm: lateness p99 with %d reschedules/s / without = %.2f (issue 21's target: ≤ 2)", b.cfg.RescheduleRate, r))
	}
	return []result{off, on}, notes, nil
}

// rescheduleStormRun is one run of the reschedule storm with rate
// reschedules/s (0: none).
func (b *bench) rescheduleStormRun(ctx context.Context, rate int) (result, error) {
	row := result{Scenario: "reschedule-storm-off", System: "delayd", Target: "core"}
	if rate > 0 {
		row.Scenario = "reschedule-storm"
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
	core, err := e.subscribe("rstorm.core", b.steadyTotal(rate0))
	if err != nil {
		return row, err
	}
	var published atomic.Int64
	var storm *rescheduler
	stormDone := make(chan error, 1)
	stopStorm := make(chan struct{})
	if rate > 0 {
		if storm, err = newRescheduler(e, rate, rate0); err != nil {
			return row, err
		}
		go func() { stormDone <- storm.run(ctx, func() int { return int(published.Load()) }, stopStorm) }()
	}
	p, err := b.publishPaced(ctx, e, row.Scenario+" delayd", rate0, func(i int) *nats.Msg {
		m := b.delaydMsg(i, "rstorm.core", 1)
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
	if storm != nil {
		b.waitCount(ctx, row.Scenario+" delayd: reschedules answered", storm.offered(), 30*time.Second, storm.answered)
	}
	b.waitCount(ctx, row.Scenario+" delayd: delivered", p.sent, time.Minute, core.count)
	if storm != nil {
		// A second delivery of a moved message (there must be none) comes
		// at its other due: the latest new due is 500 ms after the last
		// request, the latest old one 1 s after the last publish.
		time.Sleep(1500 * time.Millisecond)
	}
	if err := svc.stop(); err != nil {
		return row, err
	}
	arrs := core.arrivals()
	t := count(arrs, p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	if storm != nil {
		c := storm.counts()
		dues := map[int]map[int64]bool{} // message index: the Delay-Due-At of its deliveries
		atOld := map[int]bool{}          // message index: delivered without Delay-Rescheduled
		for _, a := range arrs {
			if dues[a.idx] == nil {
				dues[a.idx] = map[int64]bool{}
			}
			dues[a.idx][a.due.UnixNano()] = true
			atOld[a.idx] = atOld[a.idx] || !a.moved
		}
		for idx := range storm.rescheduledSet() {
			if atOld[idx] {
				c.DeliveredAtOld++
			}
		}
		for _, d := range dues {
			if len(d) > 1 {
				c.Both++
			}
		}
		row.Reschedules = &c
		row.Note = fmt.Sprintf("%d reschedules/s offered: %d sent, %d rescheduled, %d not found, %d already delivered, %d busy, %d errors, %d unanswered, %d delivered at old, %d at both",
			rate, c.Offered, c.Rescheduled, c.NotFound, c.AlreadyDelivered, c.Busy, c.Errors, c.Unanswered, c.DeliveredAtOld, c.Both)
	} else {
		row.Note = "no reschedules"
	}
	row.Note = notes(row.Note, refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, nil
}

// rescheduler sends paced reschedule requests to delayd's unscoped
// reschedule subject and records the replies, on a connection of its own
// (the stormer's shape, for reschedules).
type rescheduler struct {
	nc      *nats.Conn
	inbox   string
	rate    int // reschedules/s
	msgRate int // the level's msg/s, to pick targets by age

	mu      sync.Mutex
	targets []int          // request k's message index; -1 for an unknown id
	replies map[int]string // request k's reply
	status  map[int]string // request k's Delay-Status
}

func newRescheduler(e *env, rate, msgRate int) (*rescheduler, error) {
	nc, err := e.conn(nil)
	if err != nil {
		return nil, err
	}
	s := &rescheduler{nc: nc, inbox: nats.NewInbox(), rate: rate, msgRate: msgRate, replies: map[int]string{}, status: map[int]string{}}
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
// Request k picks its message as the cancel storm's does (stormer.pick);
// a pending one is moved to 500 ms from now (k mod 8 is 2 or 3) or run now
// (6 or 7); the others go with a run now.
func (s *rescheduler) run(ctx context.Context, published func() int, stop <-chan struct{}) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	k := 0
	for {
		want := int(float64(s.rate) * time.Since(start).Seconds())
		for ; k < want; k++ {
			idx := pickStormTarget(k, published(), s.msgRate)
			id := "no-such-" + strconv.Itoa(k)
			if idx >= 0 {
				id = stormID(idx)
			}
			h := nats.Header{contract.HeaderDuration: {"0s"}}
			if k%8 == 2 || k%8 == 3 {
				h = nats.Header{contract.HeaderDeliverAt: {contract.FormatTime(time.Now().Add(500 * time.Millisecond))}}
			}
			s.mu.Lock()
			s.targets = append(s.targets, idx)
			s.mu.Unlock()
			if err := s.nc.PublishMsg(&nats.Msg{Subject: contract.RescheduleSubject, Reply: s.inbox + "." + strconv.Itoa(k), Header: h, Data: []byte(id)}); err != nil {
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

// pickStormTarget chooses request k's message by k mod 4: 0 none (an
// unknown id), 1 one published 2 to 2.5 s ago (delivered), 2 and 3 one
// published in the last 250 ms (pending). -1 means an unknown id.
func pickStormTarget(k, published, msgRate int) int {
	var idx int
	switch k % 4 {
	case 0:
		return -1
	case 1:
		idx = published - 2*msgRate - rand.IntN(msgRate/2+1)
	default:
		idx = published - 1 - rand.IntN(msgRate/4+1)
	}
	if idx < 0 {
		return -1
	}
	return idx
}

func (s *rescheduler) offered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.targets)
}

func (s *rescheduler) answered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.replies)
}

// rescheduledSet is the messages answered "rescheduled".
func (s *rescheduler) rescheduledSet() map[int]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]bool{}
	for k, r := range s.replies {
		if r == contract.RescheduleReplyRescheduled && s.targets[k] >= 0 {
			out[s.targets[k]] = true
		}
	}
	return out
}

func (s *rescheduler) counts() rescheduleCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := rescheduleCounts{Offered: len(s.targets), Unanswered: len(s.targets) - len(s.replies)}
	for k, r := range s.replies {
		switch {
		case s.status[k] == strconv.Itoa(contract.CancelStatusBusy):
			c.Busy++
		case r == contract.RescheduleReplyRescheduled:
			c.Rescheduled++
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
