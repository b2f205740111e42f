package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestKill9Cancel cancels half of 3,000 pending messages (levels and
// cascading durations) while delayd is killed with SIGKILL and restarted
// every two seconds or so, each process once it has answered a cancel.
// Every cancel gets a final answer within a deadline;
// none is "not found" (each message's PubAck was seen before its cancel, and
// index records lost in a crash are written again at restart); every one
// answered before its message was due is "cancelled"; a message answered
// "cancelled" is never delivered, one answered "already delivered" was, and
// every message not cancelled is delivered exactly once, never early, to a
// stream-bound target.
func TestKill9Cancel(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test: skipped when testing.Short()")
	}
	b := itest.Setup(t)
	const total = 3000
	env := []string{"DELAYD_LEVELS=3s 10s", itest.KillLeaseTTLEnv}
	b.CreateStream("KILLCANCEL", "killc.>")
	p := b.StartProcess(env...)
	// The publishes below are synchronous, and a JetStream publish to a
	// subject no stream captures yet is retried only twice, 250 ms apart
	// (nats.go's default): wait until the process created its ingress
	// stream, which took longer than that on a busy machine ("publish
	// delay.killc.x: nats: no response from stream").
	itest.WaitFor(t, time.Minute, "delayd's ingress stream", func() bool {
		_, err := b.JS.Stream(context.Background(), deliver.IngressStream)
		return err == nil
	})

	rec := itest.NewRecorder(t)
	ids := make([]string, total)
	dueBy := make([]time.Time, total) // its due time is no earlier than this
	for i := range total {
		hdr := itest.Level(1 + i%2)
		delay := []time.Duration{3 * time.Second, 10 * time.Second}[i%2]
		switch i % 3 {
		case 0:
			hdr = nats.Header{contract.HeaderDuration: []string{"16500ms"}} // cascades 10s, 3s, 3s, then the rest
			delay = 16500 * time.Millisecond
		case 1:
			hdr.Set("Nats-Msg-Id", fmt.Sprintf("kc-%d", i))
		}
		dueBy[i] = time.Now().Add(delay) // stored after now: due after this
		seq := b.Publish("delay.killc.x", []byte(fmt.Sprint(i)), hdr)
		rec.ExpectKeys(fmt.Sprint(i))
		ids[i] = fmt.Sprint(seq)
		if i%3 == 1 {
			ids[i] = fmt.Sprintf("kc-%d", i)
		}
	}
	lastDue := time.Now().Add(16500 * time.Millisecond)

	replies := make(map[int]string)
	beforeDue := make(map[int]bool) // answered before its message was due
	var killer sync.WaitGroup
	stop := make(chan struct{})
	killErr := make(chan error, 1)
	var mu sync.Mutex
	var answered atomic.Int64 // final answers so far
	killer.Go(func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for {
			// Each new process waits up to the lease TTL for its dead
			// predecessor's leases, then its scanners and router start
			// before a cancel can be decided: under -race on 2 cores that
			// took longer than one TTL, and in CI runs (two end-to-end
			// test binaries at once) no process lived long enough to
			// answer one cancel in a minute. So each process is killed
			// only once it has answered a cancel, at a random moment at
			// least three TTLs after its start.
			base := answered.Load()
			select {
			case <-stop:
				return
			case <-time.After(3*itest.KillLeaseTTL + time.Duration(300+rng.IntN(900))*time.Millisecond):
			}
			for answered.Load() == base {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			mu.Lock()
			_ = p.Cmd.Process.Signal(syscall.SIGKILL)
			_ = p.Cmd.Wait()
			np, err := b.TryStartProcess(env...)
			if err == nil {
				p = np
			}
			mu.Unlock()
			if err != nil {
				killErr <- err
				return
			}
		}
	})
	began := time.Now()
	for i := 0; i < total; i += 2 {
		deadline := time.Now().Add(time.Minute)
		var last string
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			m, err := b.NC.RequestWithContext(ctx, contract.CancelSubject, []byte(ids[i]))
			cancel()
			if err == nil && (string(m.Data) == "cancelled" || string(m.Data) == "not found" || string(m.Data) == "already delivered") {
				replies[i] = string(m.Data)
				beforeDue[i] = time.Now().Before(dueBy[i])
				answered.Add(1)
				break
			}
			if last = fmt.Sprint(err); err == nil {
				last = string(m.Data)
			}
			if time.Now().After(deadline) {
				close(stop)
				killer.Wait()
				t.Fatalf("cancel %s (message %d): no final answer within a minute of retries; last %q", ids[i], i, last)
			}
			time.Sleep(20 * time.Millisecond) // delayd is down or restarting: pace the retries
		}
	}
	cancelling := time.Since(began)
	close(stop)
	killer.Wait()
	select {
	case err := <-killErr:
		t.Fatalf("restarting delayd: %v", err)
	default:
	}

	counts := map[string]int{}
	for i, r := range replies {
		counts[r]++
		if r == "cancelled" {
			rec.Excused(fmt.Sprint(i), "cancelled")
		}
	}
	wantDelivered := total - counts["cancelled"]
	itest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d delivered (replies %v)", wantDelivered, counts), func() bool {
		return b.StreamCount("KILLCANCEL") >= uint64(wantDelivered)
	})
	// Let time pass: every due time passes, so a cancelled message delivered
	// after its due would show now.
	time.Sleep(time.Until(lastDue))
	itest.WaitQuiet(t, 2*time.Second, time.Minute, func() int { return int(b.StreamCount("KILLCANCEL")) })
	rec.AddStream(b.StreamMsgs("KILLCANCEL"))
	delivered := rec.Counts()
	t.Logf("cancel replies under kill -9: %v (cancelling took %s); delivered %d distinct of %d", counts, cancelling.Round(time.Millisecond), len(delivered), total)
	rec.CheckAll()
	for i, r := range replies {
		if r == "already delivered" && delivered[fmt.Sprint(i)] != 1 {
			t.Errorf("message %d (id %s): answered already delivered, delivered %d times", i, ids[i], delivered[fmt.Sprint(i)])
		}
	}
	if n := counts["not found"]; n > 0 {
		var eg []string
		for i, r := range replies {
			if r == "not found" && len(eg) < 10 {
				eg = append(eg, ids[i])
			}
		}
		t.Errorf("%d cancels answered not found, e.g. ids %v: each message's PubAck was seen before its cancel", n, eg)
	}
	// A message not yet due can only be pending: its cancel must answer
	// cancelled (docs/guarantees.md#delivered-xor-cancelled: "already delivered" is
	// for messages handed off, which happens only at or after the due time).
	early, wrong := 0, 0
	for i, r := range replies {
		if !beforeDue[i] {
			continue
		}
		early++
		if r != "cancelled" {
			if wrong++; wrong <= 10 {
				t.Errorf("message %d (id %s): answered %q before it was due, want cancelled", i, ids[i], r)
			}
		}
	}
	t.Logf("%d cancels answered before their message was due, %d of them not cancelled", early, wrong)
	if early == 0 || counts["cancelled"] == 0 {
		t.Errorf("%d cancels answered before their message was due, %d cancelled in all: the test cancelled nothing pending", early, counts["cancelled"])
	}
	mu.Lock()
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	_ = p.Cmd.Wait()
	mu.Unlock()
}
