package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestAnyDelay publishes a seeded spread of Delay-Duration and
// Delay-Deliver-At messages through the table "1s 5s" and checks that
// each is delivered once, never before the time asked for, with
// Delay-Due-At the time asked for, and at the target before any message
// due more than half the smallest level later (the last stretch goes
// through the precision levels); the lateness it logs is the precision
// reached, asserted by no threshold. TestAnyDelayFine
// (cascade_long_test.go, go test -tags long) does the same through
// "100ms 300ms 1s", where half the smallest level is 50 ms.
func TestAnyDelay(t *testing.T) {
	t.Parallel()
	anyDelay(t, "1s 5s", time.Second, 40, 7000)
}

func anyDelay(t *testing.T, table string, smallest time.Duration, n, spread int) {
	b := itest.Setup(t)
	b.CreateStream("ANYDELAY", "any.>")
	b.StartDelayd(table)
	rng := rand.New(rand.NewPCG(42, 7))
	type want struct {
		due   time.Time // zero: enqueue + d
		d     time.Duration
		byDur bool
	}
	wants := map[string]want{}
	for i := range n {
		id := "any-" + strconv.Itoa(i)
		hdr := nats.Header{"Nats-Msg-Id": []string{id}}
		if i%3 == 0 {
			at := time.Now().Add(time.Duration(rng.IntN(spread+500)-500) * time.Millisecond) // some in the past
			hdr.Set(contract.HeaderDeliverAt, at.UTC().Format(time.RFC3339Nano))
			wants[id] = want{due: at}
		} else {
			d := time.Duration(rng.IntN(spread)) * time.Millisecond
			hdr.Set(contract.HeaderDuration, d.String())
			wants[id] = want{d: d, byDur: true}
		}
		b.Publish("delay.any.x", []byte(id), hdr)
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // let time pass: spread the store times
	}
	itest.WaitFor(t, 20*time.Second, "every message delivered", func() bool { return b.StreamCount("ANYDELAY") >= uint64(len(wants)) })
	itest.WaitQuiet(t, 300*time.Millisecond, 10*time.Second, func() int { return int(b.StreamCount("ANYDELAY")) }) // a late duplicate would show now
	rec := itest.NewRecorder(t)
	for id := range wants {
		rec.ExpectKeys(id)
	}
	rec.AddStream(b.StreamMsgs("ANYDELAY"))
	rec.CheckAll()

	var late []time.Duration
	seen := map[string]int{}
	hopped := 0
	for _, m := range b.StreamMsgs("ANYDELAY") {
		id := m.Header.Get("Nats-Msg-Id")
		seen[id]++
		w, ok := wants[id]
		if !ok {
			t.Fatalf("unexpected delivery %q", id)
		}
		enq := parseTime(t, m.Header, contract.HeaderEnqueuedAt)
		due := parseTime(t, m.Header, contract.HeaderDueAt)
		asked := w.due
		if w.byDur {
			asked = enq.Add(w.d)
		}
		if asked.Before(enq) {
			asked = enq // in the past: at once
		}
		if !due.Equal(asked) {
			t.Errorf("%s: Delay-Due-At %s, want the time asked for %s", id, due.Format(time.RFC3339Nano), asked.Format(time.RFC3339Nano))
		}
		if m.Time.Before(due) {
			t.Errorf("%s delivered %s early", id, due.Sub(m.Time))
		}
		late = append(late, m.Time.Sub(due))
		if m.Header.Get(contract.HeaderHops) != "" {
			hopped++
		}
		for _, k := range []string{contract.HeaderDuration, contract.HeaderDeliverAt, "Delayd-Origin", "Delayd-Hops", "Delayd-Hop-Due"} {
			if m.Header.Get(k) != "" {
				t.Errorf("%s: control header %s reached the target", id, k)
			}
		}
	}
	for id := range wants {
		if seen[id] != 1 {
			t.Errorf("%s delivered %d times, want 1", id, seen[id])
		}
	}
	slices.Sort(late)
	t.Logf("lateness over %d: p50=%s p99=%s max=%s; %d cascaded through levels", len(late), itest.Percentile(late, 50), itest.Percentile(late, 99), late[len(late)-1], hopped)
	// Precision as an ordering, not a clock threshold: the last stretch goes
	// through precision levels no longer than what remains, so a message is
	// at the target before any message due more than half the smallest level
	// after it. (A last stretch held in the smallest level breaks this.)
	msgs := b.StreamMsgs("ANYDELAY")
	inverted := 0
	for _, a := range msgs {
		dueA := parseTime(t, a.Header, contract.HeaderDueAt)
		for _, c := range msgs {
			if dueC := parseTime(t, c.Header, contract.HeaderDueAt); dueC.Sub(dueA) > smallest/2 && c.Sequence < a.Sequence {
				if inverted++; inverted <= 5 {
					t.Errorf("%s (due %s) stored after %s (due %s later): held past its due by a level longer than what remained",
						a.Data, dueA.Format(time.RFC3339Nano), c.Data, dueC.Sub(dueA))
				}
			}
		}
	}
	if hopped == 0 {
		t.Error("no message cascaded: the spread should include delays past two levels")
	}
}

// TestAnyDelayInvalid dead-letters ambiguous, negative, malformed and
// too-long delays.
func TestAnyDelayInvalid(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s", func(c *deliver.Config) { c.MaxDelay = time.Hour })
	cases := []nats.Header{
		{contract.HeaderLevel: {"1"}, contract.HeaderDuration: {"1s"}},
		{contract.HeaderDuration: {"1s"}, contract.HeaderDeliverAt: {time.Now().Format(time.RFC3339)}},
		{contract.HeaderDuration: {"-1s"}},
		{contract.HeaderDuration: {"soon"}},
		{contract.HeaderDuration: {"2h"}}, // beyond MaxDelay
		{contract.HeaderDeliverAt: {"tomorrow"}},
		{contract.HeaderDeliverAt: {time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)}},
		{contract.HeaderDuration: {"1s", "2s"}},
	}
	for i, h := range cases {
		b.Publish("delay.bad.x"+strconv.Itoa(i), []byte(fmt.Sprint(h)), h)
	}
	itest.WaitFor(t, 10*time.Second, "every case dead-lettered", func() bool { return b.StreamCount(deliver.DLQStream) >= uint64(len(cases)) })
	for _, m := range b.StreamMsgs(deliver.DLQStream) {
		if m.Subject != "delayd.dlq.level" || m.Header.Get(contract.HeaderError) == "" {
			t.Errorf("%s: dead letter on %s with Delay-Error %q", m.Data, m.Subject, m.Header.Get(contract.HeaderError))
		}
	}
}

// TestCascadeRestart stops delayd between hops of cascading messages and
// starts it again: each arrives once at a stream-bound target, never early.
func TestCascadeRestart(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	capture := b.CreateStream("CASCADECAP", "cas.>")
	const table = "100ms 300ms"
	b.StartDelayd(table)
	offs := itest.WatchOffsets(t, b.JS)
	const n = 50
	rec := itest.NewRecorder(t)
	for i := range n {
		h := nats.Header{contract.HeaderDuration: {"1500ms"}}
		if i%2 == 0 {
			h.Set("Nats-Msg-Id", "cas-"+strconv.Itoa(i))
		}
		b.Publish("delay.cas.x", []byte(strconv.Itoa(i)), h)
		rec.ExpectKeys(strconv.Itoa(i))
	}
	lastDue := time.Now().Add(1500 * time.Millisecond)
	// Mid-cascade: some hops done, nothing delivered yet.
	itest.WaitFor(t, 10*time.Second, "a first hop", func() bool { return b.Forwarded() > 0 })
	if n := b.StreamCount("CASCADECAP"); n != 0 {
		t.Fatalf("%d captured before the stop: not mid-cascade", n)
	}
	b.StopDelayd()
	time.Sleep(time.Until(lastDue)) // let time pass: the due times pass while delayd is down
	b.StartDelayd(table)
	itest.WaitFor(t, 15*time.Second, "all captured", func() bool {
		info, err := capture.Info(context.Background())
		return err == nil && info.State.Msgs >= n
	})
	// Let time pass: a late duplicate would show now.
	itest.WaitQuiet(t, 500*time.Millisecond, 10*time.Second, func() int { return int(b.StreamCount("CASCADECAP")) })
	msgs := b.StreamMsgs("CASCADECAP")
	rec.AddStream(msgs)
	rec.CheckAll()
	if n := offs.Check(); n == 0 {
		t.Error("no offset written")
	}
	for _, m := range msgs {
		if d := parseTime(t, m.Header, contract.HeaderDueAt).Sub(parseTime(t, m.Header, contract.HeaderEnqueuedAt)); d != 1500*time.Millisecond {
			t.Errorf("%s: due − enqueued = %s, want 1.5s across the hops", m.Data, d)
		}
	}
	if len(msgs) != n {
		t.Errorf("captured %d messages, want %d", len(msgs), n)
	}
}
