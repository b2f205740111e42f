package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
)

// TestNeverEarly publishes across every level of a short table (and level 0)
// and checks that every delivery arrives at or after ingress store time +
// the level's delay. Lateness percentiles go to the test log; no speed is
// asserted.
func TestNeverEarly(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	table := levels.MustParse("100ms 300ms 1s")
	b.StartDelayd(table.String())
	c := b.Collect("early.>")
	rec := itest.NewRecorder(t)
	rec.KeyOf = func(m *nats.Msg) string { return m.Subject + "/" + string(m.Data) }
	rec.Subscribe(b.NC, "early.>")

	const perLevel = 40
	want := 0
	for i := range perLevel {
		for lvl := 0; lvl <= table.Len(); lvl++ {
			b.Publish(fmt.Sprintf("delay.early.%d", lvl), []byte(strconv.Itoa(i)), itest.Level(lvl))
			rec.ExpectKeys(fmt.Sprintf("early.%d/%d", lvl, i))
			want++
		}
		time.Sleep(5 * time.Millisecond) // spread ingress times
	}
	got := c.Wait(t, want, 30*time.Second)

	var lateness []time.Duration
	for _, r := range got {
		lvl, _ := strconv.Atoi(r.Msg.Subject[len("early."):])
		l, _ := table.Level(lvl)
		enq := parseTime(t, r.Msg.Header, contract.HeaderEnqueuedAt)
		due := parseTime(t, r.Msg.Header, contract.HeaderDueAt)
		if d := due.Sub(enq); d != l.Delay {
			t.Fatalf("level %d: due - enqueued = %s, want %s", lvl, d, l.Delay)
		}
		if r.At.Before(due) {
			t.Errorf("level %d delivered %s early (due %s, arrived %s)", lvl, due.Sub(r.At), due, r.At)
		}
		lateness = append(lateness, r.At.Sub(due))
	}
	slices.Sort(lateness)
	t.Logf("lateness over %d deliveries: p50=%s p99=%s max=%s", len(lateness),
		itest.Percentile(lateness, 50), itest.Percentile(lateness, 99), lateness[len(lateness)-1])
	itest.WaitQuiet(t, 200*time.Millisecond, 10*time.Second, func() int { return len(c.Snapshot()) }) // a late duplicate would show now
	if n := len(c.Snapshot()); n != want {
		t.Errorf("got %d deliveries, want exactly %d", n, want)
	}
	if n := rec.CheckNeverEarly(); n != want {
		t.Errorf("recorded %d deliveries, want %d", n, want)
	}
	rec.CheckComplete()
	rec.CheckNoDuplicates() // a core target, and delayd did not crash
}

// TestFIFO checks that 1,000 messages at one level arrive in publish order.
func TestFIFO(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s")
	c := b.Collect("fifo.x")
	const n = 1000
	ctx := context.Background()
	var futs []jetstream.PubAckFuture
	for i := range n {
		f, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: "delay.fifo.x", Data: []byte(strconv.Itoa(i)), Header: itest.Level(1)})
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	select {
	case <-b.JS.PublishAsyncComplete():
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("publishes not acked")
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	got := c.Wait(t, n, 30*time.Second)
	for i, r := range got {
		if string(r.Msg.Data) != strconv.Itoa(i) {
			t.Fatalf("delivery %d carried %q: out of order", i, r.Msg.Data)
		}
	}
}

// TestIsolation checks that a long level's head never holds back a short
// level: the short message is delivered while the long one is still pending.
func TestIsolation(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 10s")
	c := b.Collect("iso.>")
	b.Publish("delay.iso.long", []byte("long"), itest.Level(2))
	b.Publish("delay.iso.short", []byte("short"), itest.Level(1))
	got := c.Wait(t, 1, 9*time.Second)
	if got[0].Msg.Subject != "iso.short" {
		t.Fatalf("first delivery on %s, want iso.short", got[0].Msg.Subject)
	}
	longDue := parseTime(t, got[0].Msg.Header, contract.HeaderEnqueuedAt).Add(10 * time.Second)
	if !got[0].At.Before(longDue) {
		t.Fatalf("short level delivered at %s, not before the long level's due %s", got[0].At, longDue)
	}
}

// TestRestartExactlyOnce stops delayd gracefully with messages pending in
// several levels, starts it again, and checks that every message reaches a
// stream-bound target exactly once, counted by Nats-Msg-Id.
func TestRestartExactlyOnce(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	target := b.CreateStream("CAPTURE", "captured.>")
	table := "100ms 500ms 2s"
	b.StartDelayd(table)

	const perLevel = 300
	var total int
	publishBatch := func(round int) {
		for i := range perLevel {
			for lvl := 0; lvl <= 3; lvl++ {
				hdr := itest.Level(lvl)
				if i%2 == 0 {
					hdr.Set("Nats-Msg-Id", fmt.Sprintf("user-%d-%d-%d", round, lvl, i))
				}
				b.Publish(fmt.Sprintf("delay.captured.l%d", lvl), []byte(fmt.Sprint(round, lvl, i)), hdr)
				total++
			}
		}
	}
	publishBatch(0)
	b.StopDelayd()  // graceful: pending messages in every level
	publishBatch(1) // published while delayd is down
	b.StartDelayd(table)
	publishBatch(2)

	itest.WaitFor(t, 30*time.Second, "all captured", func() bool {
		info, err := target.Info(context.Background())
		return err == nil && info.State.Msgs >= uint64(total)
	})
	itest.WaitQuiet(t, 500*time.Millisecond, 10*time.Second, func() int { return int(b.StreamCount("CAPTURE")) }) // a late duplicate would show now
	// Counted by payload: the target stream drops a repeated Nats-Msg-Id,
	// so a per-id count there could never exceed 1.
	msgs := b.StreamMsgs("CAPTURE")
	ids := map[string]int{}
	for _, m := range msgs {
		id := m.Header.Get("Nats-Msg-Id")
		if id == "" {
			t.Fatal("delivery without Nats-Msg-Id")
		}
		ids[id]++
	}
	if len(ids) != total {
		t.Fatalf("captured %d distinct ids, want %d", len(ids), total)
	}
	rec := itest.NewRecorder(t)
	for _, m := range msgs {
		rec.ExpectKeys(string(m.Data)) // every payload is distinct: round, level, index
	}
	rec.AddStream(msgs)
	rec.CheckAll()
	if n := len(rec.Counts()); n != total {
		t.Errorf("captured %d distinct payloads, want %d", n, total)
	}
	if n := b.StreamCount("CAPTURE"); n != uint64(total) {
		t.Errorf("target stream holds %d messages, want %d", n, total)
	}
	// Every level stream is purged down to its last delivered message once
	// its level has been quiet for a second: exactly one message (an empty
	// stream would mean the router lost its exactly-once tail).
	for _, name := range []string{"DELAYD_0S", "DELAYD_100MS", "DELAYD_500MS", "DELAYD_2S"} {
		itest.WaitFor(t, 10*time.Second, name+" purged to its last delivered message", func() bool { return b.StreamCount(name) == 1 })
	}
}

// TestTableChangeDrainsRemovedLevel removes a level from the table while it
// holds messages; they are still delivered after restart.
func TestTableChangeDrainsRemovedLevel(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	c := b.Collect("removed.>")
	b.StartDelayd("100ms 2s")
	for i := range 5 {
		b.Publish("delay.removed.x", []byte(strconv.Itoa(i)), itest.Level(2))
	}
	itest.WaitFor(t, 10*time.Second, "routed to DELAYD_2S", func() bool { return b.LevelCount("DELAYD_2S") == 5 })
	b.StopDelayd()
	b.StartDelayd("100ms 500ms") // 2s is gone from the table
	got := c.Wait(t, 5, 15*time.Second)
	for i, r := range got {
		if string(r.Msg.Data) != strconv.Itoa(i) {
			t.Fatalf("delivery %d = %q, want %d", i, r.Msg.Data, i)
		}
		due := parseTime(t, r.Msg.Header, contract.HeaderDueAt)
		if r.At.Before(due) {
			t.Errorf("delivered %s early", due.Sub(r.At))
		}
		if d := due.Sub(parseTime(t, r.Msg.Header, contract.HeaderEnqueuedAt)); d != 2*time.Second {
			t.Errorf("due - enqueued = %s, want the removed level's 2s", d)
		}
	}
}
