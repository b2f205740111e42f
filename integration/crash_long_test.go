//go:build long

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
	// docs/guarantees.md#at-least-once: a core subscriber's re-deliveries after a
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
