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

	"github.com/delayd/delayd/contract"
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
// while disconnected, must resume by itself, and must lose and duplicate
// nothing.
func TestServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test (30 s outage): skipped when testing.Short()")
	}
	b := setup(t)
	port := b.srv.Addr().(*net.TCPAddr).Port
	capture := b.createStream("RESTARTCAP", "rs.>")
	p := b.startProcess("DELAYD_LEVELS=1s 5s")
	waitFor(t, 20*time.Second, "level streams", func() bool {
		_, err := b.js.Stream(context.Background(), "DELAYD_5S")
		return err == nil
	})

	const total = 2000
	for i := range total {
		b.publish("delay.rs."+strconv.Itoa(i%7), []byte(strconv.Itoa(i)), level(1+i%2))
	}
	time.Sleep(500 * time.Millisecond) // some delivered, most pending

	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	down := time.Now()
	time.Sleep(2 * time.Second) // let delayd notice
	ticks0, t0 := cpuTicks(t, p.cmd.Process.Pid), time.Now()
	time.Sleep(28 * time.Second)
	ticks1, t1 := cpuTicks(t, p.cmd.Process.Pid), time.Now()
	const hz = 100 // USER_HZ on Linux
	cores := float64(ticks1-ticks0) / hz / t1.Sub(t0).Seconds()
	t.Logf("CPU while disconnected: %d ticks in %s = %.3f of a core", ticks1-ticks0, t1.Sub(t0).Round(time.Millisecond), cores)
	if cores >= 0.2 {
		t.Errorf("delayd used %.2f of a core while disconnected, want < 0.2", cores)
	}

	b.srv = startServer(t, b.storeDir, port)
	t.Logf("server back after %s", time.Since(down).Round(time.Millisecond))
	waitFor(t, 60*time.Second, "every message captured after the restart", func() bool {
		info, err := capture.Info(context.Background())
		return err == nil && info.State.Msgs >= total
	})
	time.Sleep(time.Second)
	ids := map[string]int{}
	early := 0
	for _, m := range b.streamMsgs("RESTARTCAP") {
		ids[m.Header.Get("Nats-Msg-Id")]++
		if due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt)); err != nil || m.Time.Before(due) {
			early++
		}
	}
	t.Logf("published=%d captured=%d distinct=%d early=%d", total, b.streamCount("RESTARTCAP"), len(ids), early)
	if len(ids) != total || b.streamCount("RESTARTCAP") != total {
		t.Errorf("captured %d messages with %d distinct ids, want %d of each", b.streamCount("RESTARTCAP"), len(ids), total)
	}
	if early != 0 {
		t.Errorf("%d deliveries stored before their due time", early)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("graceful stop after the restart: %v\n%s", err, p.out.String())
	}
}
