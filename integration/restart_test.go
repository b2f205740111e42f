//go:build long

package integration

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
)

// cpuTicks returns a process's user+system CPU time in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime
}

// TestServerRestart takes the NATS server away for 30 s while deliveries
// are due, with delayd running as a separate process. delayd must not spin
// while disconnected (its CPU rate then is under a tenth of its rate while
// working, measured in the same run), must resume by itself, and must lose
// and duplicate nothing, and deliver nothing early.
func TestServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test (30 s outage): skipped when testing.Short()")
	}
	b := itest.Setup(t)
	port := b.Srv.Addr().(*net.TCPAddr).Port
	capture := b.CreateStream("RESTARTCAP", "rs.>")
	p := b.StartProcess("DELAYD_LEVELS=1s 5s")
	itest.WaitFor(t, 20*time.Second, "level streams", func() bool {
		_, err := b.JS.Stream(context.Background(), "DELAYD_5S")
		return err == nil
	})

	const total = 2000
	// The reference, in the same run: delayd's CPU while it routes and
	// starts delivering the messages.
	busy0, bt0 := cpuTicks(t, p.Cmd.Process.Pid), time.Now()
	for i := range total {
		b.Publish("delay.rs."+strconv.Itoa(i%7), []byte(strconv.Itoa(i)), itest.Level(1+i%2))
	}
	itest.WaitFor(t, 20*time.Second, "some delivered", func() bool { return b.StreamCount("RESTARTCAP") > 0 })
	busy1, bt1 := cpuTicks(t, p.Cmd.Process.Pid), time.Now()
	if n := b.StreamCount("RESTARTCAP"); n >= total {
		t.Fatalf("all %d delivered before the outage: nothing pending", n)
	}

	b.Srv.Shutdown()
	b.Srv.WaitForShutdown()
	down := time.Now()
	time.Sleep(2 * time.Second) // let time pass: delayd notices the outage
	ticks0, t0 := cpuTicks(t, p.Cmd.Process.Pid), time.Now()
	time.Sleep(28 * time.Second) // let time pass: the outage a spinning delayd would burn CPU in
	ticks1, t1 := cpuTicks(t, p.Cmd.Process.Pid), time.Now()
	busyRate := float64(busy1-busy0) / bt1.Sub(bt0).Seconds()
	idleRate := float64(ticks1-ticks0) / t1.Sub(t0).Seconds()
	t.Logf("CPU ticks/s: %.2f while routing and delivering (%d ticks in %s), %.2f while disconnected (%d ticks in %s, %.3f of a core)",
		busyRate, busy1-busy0, bt1.Sub(bt0).Round(time.Millisecond), idleRate, ticks1-ticks0, t1.Sub(t0).Round(time.Millisecond), idleRate/100)
	// Not spinning: disconnected, delayd uses under a tenth of the CPU rate
	// of its own real work in this run (a busy loop uses at least as much).
	if idleRate*10 > busyRate {
		t.Errorf("delayd used %.2f ticks/s while disconnected, more than a tenth of its %.2f ticks/s while working: it spins", idleRate, busyRate)
	}

	b.Srv = itest.StartServer(t, b.StoreDir, port)
	t.Logf("server back after %s", time.Since(down).Round(time.Millisecond))
	itest.WaitFor(t, 60*time.Second, "every message captured after the restart", func() bool {
		info, err := capture.Info(context.Background())
		return err == nil && info.State.Msgs >= total
	})
	itest.WaitQuiet(t, time.Second, 30*time.Second, func() int { return int(b.StreamCount("RESTARTCAP")) }) // a late duplicate would show now
	rec := itest.NewRecorder(t)
	for i := range total {
		rec.ExpectKeys(strconv.Itoa(i))
	}
	msgs := b.StreamMsgs("RESTARTCAP")
	rec.AddStream(msgs)
	t.Logf("published=%d captured=%d", total, len(msgs))
	rec.CheckAll()
	if len(msgs) != total {
		t.Errorf("captured %d messages, want %d", len(msgs), total)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Wait(); err != nil {
		t.Errorf("graceful stop after the restart: %v\n%s", err, p.Out.String())
	}
}
