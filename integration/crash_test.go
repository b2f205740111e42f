package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/offsets"
)

// TestKill9 runs delayd as a separate process against an external
// nats-server, kills it with SIGKILL at random moments while 100,000
// messages flow through several levels, and restarts it each time. Nothing
// may be lost or early; a stream-bound target sees no duplicate; a core
// subscriber's raw re-deliveries are reported.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test: skipped when testing.Short()")
	}
	b := itest.Setup(t)
	const (
		total = 100_000
		kills = 20
	)
	env := []string{"DELAYD_LEVELS=100ms 300ms 1s", itest.KillLeaseTTLEnv}
	capture := b.CreateStream("KILLCAP", "kill.>")

	// Core subscriber: counts every raw delivery and early arrivals.
	var (
		mu        sync.Mutex
		seen      = make(map[string]int, total)
		early     atomic.Int64
		coreTotal atomic.Int64
	)
	coreRec := itest.NewRecorder(t) // raw re-deliveries allowed: delayd crashes
	sub, err := b.NC.Subscribe("kill.>", func(m *nats.Msg) {
		now := time.Now()
		coreRec.Record(m, now)
		coreTotal.Add(1)
		if due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt)); err != nil || now.Before(due) {
			early.Add(1)
		}
		mu.Lock()
		seen[m.Header.Get("Nats-Msg-Id")]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer func() { _ = sub.Unsubscribe() }()

	p := b.StartProcess(env...)
	itest.WaitFor(t, 20*time.Second, "the offsets bucket", func() bool {
		_, err := b.JS.KeyValue(context.Background(), offsets.Bucket)
		return err == nil
	})
	offs := itest.WatchOffsets(t, b.JS)

	// Publisher: async, bounded, over four levels (0 included).
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := range total {
			hdr := itest.Level(i % 4)
			if i%3 == 0 {
				hdr.Set("Nats-Msg-Id", fmt.Sprintf("own-%d", i))
			}
			for {
				_, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: fmt.Sprintf("delay.kill.l%d", i%4), Data: []byte(fmt.Sprint(i)), Header: hdr})
				if err == nil {
					break
				}
				time.Sleep(time.Millisecond) // pacing a retry of a refused async publish
			}
			if i%2000 == 0 {
				<-b.JS.PublishAsyncComplete()
			}
		}
		<-b.JS.PublishAsyncComplete()
	}()
	_ = jetstream.PubAck{}

	rng := rand.New(rand.NewPCG(1, 2))
	for k := range kills {
		// Let time pass: a random moment to kill at, once the new process has
		// waited for its predecessor's leases.
		time.Sleep(itest.KillLeaseTTL + time.Duration(200+rng.IntN(800))*time.Millisecond)
		if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = p.Cmd.Wait()
		t.Logf("kill %d at %s: captured %d", k+1, time.Now().Format("15:04:05.000"), b.StreamCount("KILLCAP"))
		p = b.StartProcess(env...)
	}
	<-pubDone

	itest.WaitFor(t, 3*time.Minute, "every message captured", func() bool {
		info, err := capture.Info(context.Background())
		return err == nil && info.State.Msgs >= total
	})
	itest.WaitQuiet(t, time.Second, time.Minute, func() int { return int(coreTotal.Load()) }) // late duplicates would show now
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Wait(); err != nil {
		t.Errorf("graceful stop: %v\n%s", err, p.Out.String())
	}

	stored := b.StreamCount("KILLCAP")
	mu.Lock()
	distinct := len(seen)
	raw := coreTotal.Load()
	mu.Unlock()
	t.Logf("published=%d captured=%d core distinct=%d core raw=%d core re-deliveries=%d early=%d",
		total, stored, distinct, raw, raw-int64(distinct), early.Load())
	if stored != total {
		t.Errorf("target stream holds %d messages, want exactly %d (lost or duplicated)", stored, total)
	}
	if distinct != total {
		t.Errorf("core subscriber saw %d distinct ids, want %d", distinct, total)
	}
	if early.Load() != 0 {
		t.Errorf("%d deliveries arrived before Delay-Due-At", early.Load())
	}
	// README "At-least-once": a core subscriber's re-deliveries after a
	// crash are at most the deliveries past the committed offset, one window
	// of 512 per level; four levels here (0 included).
	if redelivered, bound := raw-int64(distinct), int64(kills*4*deliver.ScannerWindowDefault); redelivered > bound {
		t.Errorf("%d raw re-deliveries at the core subscriber over %d kills, more than one window of %d per level per kill (%d)", redelivered, kills, deliver.ScannerWindowDefault, bound)
	}
	if n := b.StreamCount(deliver.IngressStream); n != 0 {
		t.Errorf("ingress still holds %d messages", n)
	}
	streamRec := itest.NewRecorder(t)
	for i := range total {
		k := fmt.Sprint(i)
		coreRec.ExpectKeys(k)
		streamRec.ExpectKeys(k)
	}
	coreRec.CheckNeverEarly()
	coreRec.CheckComplete()
	streamRec.AddStream(b.StreamMsgs("KILLCAP"))
	streamRec.CheckAll()
	t.Logf("%d offset updates, across %d kills", offs.Check(), kills)
}

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
	// cancelled (README "Delivered xor cancelled": "already delivered" is
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

// TestKill9Index publishes 20,000 messages to a one-hour level while delayd
// is killed with SIGKILL six times, then cancels every tenth by its ingress
// sequence: each must be found and cancelled. (Index records lost between a
// level write and the index write are written again at the next start.)
func TestKill9Index(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test: skipped when testing.Short()")
	}
	b := itest.Setup(t)
	env := []string{"DELAYD_LEVELS=1s 1h", itest.KillLeaseTTLEnv}
	p := b.StartProcess(env...)
	const total = 20000
	var (
		mu   sync.Mutex
		seqs []uint64
	)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := range total {
			for {
				f, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: "delay.ki.x", Data: []byte(fmt.Sprint(i)), Header: itest.Level(2)})
				if err == nil {
					go func() {
						if a, ok := <-f.Ok(); ok {
							mu.Lock()
							seqs = append(seqs, a.Sequence)
							mu.Unlock()
						}
					}()
					break
				}
				time.Sleep(time.Millisecond) // pacing a retry of a refused async publish
			}
			if i%1000 == 0 {
				<-b.JS.PublishAsyncComplete()
			}
		}
		<-b.JS.PublishAsyncComplete()
	}()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 6 {
		// Let time pass: a random moment to kill at, after the lease wait.
		time.Sleep(itest.KillLeaseTTL + time.Duration(100+rng.IntN(400))*time.Millisecond)
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		_ = p.Cmd.Wait()
		p = b.StartProcess(env...)
	}
	<-pubDone
	itest.WaitFor(t, time.Minute, "ingress routed", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
	mu.Lock()
	all := slices.Clone(seqs)
	mu.Unlock()
	slices.Sort(all)
	if len(all) != total {
		t.Errorf("%d of %d publishes acknowledged: the sample of cancels would shrink", len(all), total)
	}
	counts := map[string]int{}
	var bad []uint64
	for i := 0; i < len(all); i += 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		m, err := b.NC.RequestWithContext(ctx, contract.CancelSubject, []byte(fmt.Sprint(all[i])))
		cancel()
		r := "error"
		if err == nil {
			r = string(m.Data)
		}
		counts[r]++
		if r != "cancelled" && len(bad) < 10 {
			bad = append(bad, all[i])
		}
	}
	t.Logf("%d messages, 6 kills; cancels of every tenth: %v", len(all), counts)
	if len(bad) > 0 {
		t.Errorf("pending messages not cancelled after kill -9, e.g. sequences %v\n%s", bad, p.Out.String())
	}
	if n := b.LevelCount("DELAYD_1H"); n != total {
		t.Errorf("DELAYD_1H holds %d, want %d", n, total)
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	_ = p.Cmd.Wait()
}
