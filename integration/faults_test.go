package integration

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// TestClockSkew runs delayd with a scanner clock that is ahead of, or behind,
// the server's by seconds. Due times come from the server's store time, and
// the scanner bounds its own skew from server timestamps, so a clock ahead
// never delivers early and a clock behind does not deliver late by the skew.
func TestClockSkew(t *testing.T) {
	t.Parallel()
	// Behind by 10 s, not 2: the marker below then leaves deliveries 7.5 s
	// of lateness under -race and load, while a scanner on its own clock
	// is still 2.5 s later than the marker.
	for _, skew := range []time.Duration{2 * time.Second, -10 * time.Second} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			b.StartDelayd("100ms 500ms", func(c *deliver.Config) {
				clock := &wallClock{}
				clock.step(skew)
				c.Clock = clock
			})
			c := b.Collect("skew.>")
			const n = 30
			var lastDue time.Time
			for i := range n {
				b.Publish("delay.skew.x", []byte(strconv.Itoa(i)), itest.Level(1+i%2))
				lastDue = time.Now().Add(500 * time.Millisecond)
				time.Sleep(10 * time.Millisecond) // let time pass: spread the store times
			}
			if skew < 0 {
				// A marker sent straight to the subject three quarters of
				// the skew after the last due time (the test's clock is the
				// server's): a scanner going by its own clock, behind by the
				// skew, would deliver after it.
				time.Sleep(time.Until(lastDue.Add(-skew * 3 / 4)))
				if err := b.NC.Publish("skew.marker", []byte("marker")); err != nil {
					t.Fatal(err)
				}
			}
			got := c.Wait(t, n, 30*time.Second)
			var late []time.Duration
			for i, r := range got {
				if r.Msg.Subject == "skew.marker" {
					// After every delivery is fine: the collector may hold
					// it too by the time the wait returns.
					if i < n {
						t.Errorf("the marker sent %s after the last due time arrived before %d of %d deliveries: a scanner clock behind by %s made them late by the skew", -skew*3/4, n-i, n, -skew)
					}
					break
				}
				due := parseTime(t, r.Msg.Header, contract.HeaderDueAt)
				if r.At.Before(due) {
					t.Errorf("delivered %s early with the scanner clock off by %s", due.Sub(r.At), skew)
				}
				late = append(late, r.At.Sub(due))
			}
			slices.Sort(late)
			if len(late) > 0 {
				t.Logf("scanner clock off by %s: lateness p50=%s max=%s", skew, itest.Percentile(late, 50), late[len(late)-1])
			}
		})
	}
}

// TestOffsetsThatMakeNoSense stores offsets that cannot be right for their
// level stream, then starts delayd: it corrects each one, persists the
// correction, and delivers on time with nothing lost.
func TestOffsetsThatMakeNoSense(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		value func(last uint64) string // "" deletes the key
	}{
		{"beyond the last sequence", func(last uint64) string { return strconv.FormatUint(last+1000, 10) }},
		{"below the first sequence", func(uint64) string { return "1" }},
		{"garbage", func(uint64) string { return "banana" }},
		{"missing", func(uint64) string { return "" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			c := b.Collect("off.>")
			const table = "100ms 1s"
			// First life: deliver 20 messages, so the stream is purged to its tail.
			b.StartDelayd(table)
			for i := range 20 {
				b.Publish("delay.off.x", []byte("a"+strconv.Itoa(i)), itest.Level(1))
			}
			c.Wait(t, 20, 10*time.Second)
			// The stream also holds the router's epoch marker of each life
			// (docs/guarantees.md#epoch-markers): its last sequence, not the message
			// count, is where the offset ends.
			lastSeq := func() uint64 {
				s, err := b.JS.Stream(context.Background(), "DELAYD_100MS")
				if err != nil {
					t.Fatal(err)
				}
				return s.CachedInfo().State.LastSeq
			}
			last := lastSeq()
			itest.WaitFor(t, 10*time.Second, "offset committed", func() bool {
				_, ss := b.Svc.Stats()
				for _, s := range ss {
					if s.Stream == "DELAYD_100MS" {
						return last >= 20 && s.Offset == last
					}
				}
				return false
			})
			b.StopDelayd()

			kv, err := b.JS.KeyValue(context.Background(), offsets.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			if v := tc.value(last); v == "" {
				if err := kv.Delete(context.Background(), "DELAYD_100MS"); err != nil {
					t.Fatal(err)
				}
			} else if _, err := kv.Put(context.Background(), "DELAYD_100MS", []byte(v)); err != nil {
				t.Fatal(err)
			}

			// Second life: 20 more, all delivered, none early.
			b.StartDelayd(table)
			for i := range 20 {
				b.Publish("delay.off.x", []byte("b"+strconv.Itoa(i)), itest.Level(1))
			}
			itest.WaitFor(t, 15*time.Second, "second batch delivered", func() bool {
				n := 0
				for _, r := range c.Snapshot() {
					if r.Msg.Data[0] == 'b' {
						n++
					}
				}
				return n >= 20
			})
			rec := itest.NewRecorder(t)
			for _, r := range c.Snapshot() {
				rec.Record(r.Msg, r.At)
			}
			rec.CheckNeverEarly()
			seen := rec.Counts()
			for i := range 20 {
				if seen["b"+strconv.Itoa(i)] != 1 {
					t.Errorf("b%d delivered %d times, want 1", i, seen["b"+strconv.Itoa(i)])
				}
			}
			// At most the kept tail message is delivered again.
			again := 0
			for i := range 20 {
				again += seen["a"+strconv.Itoa(i)] - 1
			}
			if again > 1 {
				t.Errorf("%d first-life messages delivered again, want at most the kept tail", again)
			}
			// The correction was persisted and is a sane sequence now: the
			// stream's last.
			last = lastSeq()
			itest.WaitFor(t, 10*time.Second, "offset corrected", func() bool {
				e, err := kv.Get(context.Background(), "DELAYD_100MS")
				if err != nil {
					return false
				}
				v, err := strconv.ParseUint(string(e.Value()), 10, 64)
				return err == nil && last >= 40 && v == last
			})
		})
	}
}

// TestLargeMessageBeyondBatchBytes delivers a message larger than a
// scanner's per-pull byte budget (1 MiB) on a server that allows 4 MiB
// payloads: the scanner must not stall on it.
func TestLargeMessageBeyondBatchBytes(t *testing.T) {
	t.Parallel()
	opts := natstest.Options(t.TempDir())
	opts.MaxPayload = 4 << 20
	b := &itest.Bundle{T: t, Srv: natstest.Start(t, opts)}
	b.Connect()
	b.StartDelayd("100ms")
	c := b.Collect("large.x")
	data := make([]byte, 2<<20)
	for i := range data {
		data[i] = byte(i)
	}
	b.Publish("delay.large.x", data, itest.Level(1))
	b.Publish("delay.large.x", []byte("after"), itest.Level(1))
	got := c.Wait(t, 2, 15*time.Second)
	if len(got[0].Msg.Data) != len(data) || string(got[1].Msg.Data) != "after" {
		t.Fatalf("got %d bytes then %q, want %d bytes then \"after\"", len(got[0].Msg.Data), got[1].Msg.Data, len(data))
	}
}

// TestStartGrace: after a restart, deliveries to core subjects that were
// already overdue wait the start grace (subscribers of a restarted embedded
// server reconnect meanwhile); a message that falls due later, at another
// level, is not held. (At the same level it waits behind the held one: FIFO.)
func TestStartGrace(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	c := b.Collect("grace.>")
	b.StartDelayd("100ms 200ms")
	b.StopDelayd()
	b.Publish("delay.grace.overdue", []byte("overdue"), itest.Level(1))
	time.Sleep(300 * time.Millisecond) // let time pass: the message (level 100ms) is now overdue
	// The grace starts inside Run, before StartDelayd has waited for ready
	// and the scanners, and the fresh message is published only after
	// that: a grace of a few times a slow (-race, loaded) start keeps the
	// fresh one due before the grace ends.
	const grace = 5 * time.Second
	started := time.Now()
	b.StartDelayd("100ms 200ms", func(cfg *deliver.Config) { cfg.StartGrace, cfg.GraceAtStart = grace, true })
	b.Publish("delay.grace.fresh", []byte("fresh"), itest.Level(2))
	got := c.Wait(t, 2, grace+15*time.Second)
	// Held, not late: the fresh message, due after the start, arrives before
	// the overdue one the grace holds.
	if string(got[0].Msg.Data) != "fresh" || string(got[1].Msg.Data) != "overdue" {
		t.Errorf("delivered %q then %q, want fresh then overdue: a message due after start was held by the start grace", got[0].Msg.Data, got[1].Msg.Data)
	}
	for _, r := range got {
		if string(r.Msg.Data) == "overdue" && r.At.Before(started.Add(grace)) {
			t.Errorf("overdue delivery arrived %s after start, before the %s grace", r.At.Sub(started), grace)
		}
	}
}

// TestReconnectGrace: deliveries to core subjects that fall due while the
// server is away wait the start grace after delayd reconnects, so a core
// subscriber that reconnects a moment later still gets them.
func TestReconnectGrace(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	port := b.Srv.Addr().(*net.TCPAddr).Port
	c := b.Collect("rg.>")
	const grace = time.Second
	b.StartDelayd("100ms 1s", func(cfg *deliver.Config) { cfg.StartGrace = grace })
	b.Publish("delay.rg.x", []byte("during the outage"), itest.Level(2))
	b.Srv.Shutdown()
	b.Srv.WaitForShutdown()
	time.Sleep(1500 * time.Millisecond) // let time pass: the message (level 1s) falls due while the server is away
	back := time.Now()
	b.Srv = itest.StartServer(t, b.StoreDir, port)
	got := c.Wait(t, 1, 15*time.Second)
	if got[0].At.Before(back.Add(grace)) {
		t.Errorf("delivered %s after the server came back, before the %s grace", got[0].At.Sub(back), grace)
	}
	itest.WaitQuiet(t, 200*time.Millisecond, 10*time.Second, func() int { return len(c.Snapshot()) }) // a duplicate would show now
	if n := len(c.Snapshot()); n != 1 {
		t.Errorf("delivered %d times, want once", n)
	}
}

// TestLevelStreamDeletedWhileRunning deletes a level stream under a running
// delayd: the router recreates it, and every message routed after the
// deletion is delivered (the scanner must not purge or read the new stream
// by the old one's offset).
func TestLevelStreamDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	c := b.Collect("recreated.>")
	b.StartDelayd("100ms 300ms")
	for i := range 30 {
		b.Publish("delay.recreated.before", []byte("b"+strconv.Itoa(i)), itest.Level(2))
	}
	c.Wait(t, 30, 10*time.Second)
	itest.WaitFor(t, 10*time.Second, "a purge of DELAYD_300MS (its first sequence past 1)", func() bool {
		s, err := b.JS.Stream(context.Background(), "DELAYD_300MS")
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.FirstSeq > 1 && b.ScannerStats("DELAYD_300MS").Offset >= 30
	})
	if err := b.JS.DeleteStream(context.Background(), "DELAYD_300MS"); err != nil {
		t.Fatal(err)
	}
	// More than the old stream's offset, so a stale offset would skip some.
	for i := range 45 {
		b.Publish("delay.recreated.after", []byte("a"+strconv.Itoa(i)), itest.Level(2))
		time.Sleep(10 * time.Millisecond) // let time pass: spread the store times
	}
	itest.WaitFor(t, 20*time.Second, "every message routed after the deletion delivered", func() bool {
		n := 0
		for _, r := range c.Snapshot() {
			if r.Msg.Subject == "recreated.after" {
				n++
			}
		}
		return n >= 45
	})
}
