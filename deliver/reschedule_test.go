package deliver

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
)

// The reschedule tests' target is a core subject ("rtg.>", no stream):
// every delivery is seen, a second one of the same id too (a stream target
// would drop it as a duplicate within its window).

// delivery is one delivery a core subscriber received.
type delivery struct {
	payload string
	h       nats.Header
	at      time.Time // when it was received
}

// catcher records every delivery to rtg.> in order.
type catcher struct {
	mu  sync.Mutex
	all []delivery
}

// catch subscribes to rtg.> on the test's connection.
func (b *ownerBundle) catch() *catcher {
	b.t.Helper()
	c := &catcher{}
	sub, err := b.nc.Subscribe("rtg.>", func(m *nats.Msg) {
		c.mu.Lock()
		c.all = append(c.all, delivery{payload: string(m.Data), h: m.Header, at: time.Now()})
		c.mu.Unlock()
	})
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

// of returns the deliveries of payload, in order.
func (c *catcher) of(payload string) []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []delivery
	for _, g := range c.all {
		if g.payload == payload {
			out = append(out, g)
		}
	}
	return out
}

// wait waits until every one of payloads was delivered at least once.
func (c *catcher) wait(t *testing.T, within time.Duration, payloads ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var missing []string
		for _, p := range payloads {
			if len(c.of(p)) == 0 {
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered within %s: %d of %d (first %q)", within, len(missing), len(payloads), missing[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dueOf is a delivery's Delay-Due-At.
func dueOf(t *testing.T, g delivery) time.Time {
	t.Helper()
	due, err := time.Parse(time.RFC3339Nano, g.h.Get(contract.HeaderDueAt))
	if err != nil {
		t.Fatalf("delivery %q: Delay-Due-At %q: %v", g.payload, g.h.Get(contract.HeaderDueAt), err)
	}
	return due
}

// reschedule asks the reschedule API (scoped to target) to move id with
// the delay header h, and returns the answer's code, body and new due.
func (b *ownerBundle) reschedule(target, id string, h nats.Header) (code int, body string, due time.Time) {
	b.t.Helper()
	m, err := b.nc.RequestMsg(&nats.Msg{Subject: contract.RescheduleSubjectFor(target), Data: []byte(id), Header: h}, time.Minute)
	if err != nil {
		b.t.Fatalf("reschedule %s: %v", id, err)
	}
	code, _ = strconv.Atoi(m.Header.Get(contract.HeaderStatus))
	if s := m.Header.Get(contract.HeaderDueAt); s != "" {
		if due, err = time.Parse(time.RFC3339Nano, s); err != nil {
			b.t.Fatalf("reschedule %s: Delay-Due-At %q: %v", id, s, err)
		}
	}
	return code, string(m.Data), due
}

// mustReschedule is reschedule that must answer "rescheduled".
func (b *ownerBundle) mustReschedule(target, id string, h nats.Header) time.Time {
	b.t.Helper()
	code, body, due := b.reschedule(target, id, h)
	if code != contract.RescheduleStatusRescheduled || body != contract.RescheduleReplyRescheduled || due.IsZero() {
		b.t.Fatalf("reschedule %s: %d %q (due %v), want %d %q with a due", id, code, body, due, contract.RescheduleStatusRescheduled, contract.RescheduleReplyRescheduled)
	}
	return due
}

// in is a Delay-Duration header.
func in(d string) nats.Header { return nats.Header{contract.HeaderDuration: {d}} }

// withID is h with a Nats-Msg-Id.
func withID(h nats.Header, id string) nats.Header {
	h[contract.HeaderNatsMsgID] = []string{id}
	return h
}

// TestRescheduleDecidedByOwner: with every level owned by replica A,
// reschedules taken by replica B (which owns no level) are decided and
// moved by A through the level's decide subject (op "reschedule"): each
// answers "rescheduled", and each message is delivered once, with its new
// due, at or after it.
func TestRescheduleDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	_, c := b.splitOwners()
	rx := b.catch()
	for i := range 3 {
		p := fmt.Sprintf("ro-%d", i)
		b.publishTo("rtg.ro", p, withID(in("3s"), p))
	}
	b.waitRouted()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	dues := make([]time.Time, 3)
	for i := range dues { // B's own path: never A's scanner
		p := fmt.Sprintf("ro-%d", i)
		answer, due, err := c.svc.parts.cancelAPI.Reschedule(ctx, reader, p, in("5s"), "rtg.ro", time.Time{})
		if err != nil || answer != level.AnswerRescheduled {
			t.Fatalf("reschedule %s through B (no level owned): %v, %v; want rescheduled", p, answer, err)
		}
		dues[i] = due
	}
	rx.wait(t, time.Minute, "ro-0", "ro-1", "ro-2")
	for i, due := range dues {
		p := fmt.Sprintf("ro-%d", i)
		ds := rx.of(p)
		if len(ds) != 1 || !dueOf(t, ds[0]).Equal(due) || ds[0].at.Before(due) {
			t.Errorf("%s: %d deliveries, want one with Delay-Due-At %s, at or after it", p, len(ds), contract.FormatTime(due))
		}
	}
}
