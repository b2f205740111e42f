package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// TestShutdownStuckServer: a delayd process whose NATS server stops
// answering at its SIGTERM, messages due every 10 ms (as an embedded
// server's JetStream does once its store directory is deleted: writes
// fail, or are never answered), exits with status 1, not 0, and its log
// says why: its last offset writes unacknowledged, its connection found
// stale during the shutdown (pings every second), or its shutdown past
// shutdownTimeout. (Before, it took about 30 s, some of it waiting on
// writes that could not succeed, and then exited 0 "delayd stopped
// cleanly" with nothing committed.) The server is reached through a proxy
// that, frozen, keeps every connection open and forwards nothing.
func TestShutdownStuckServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds delayd and waits out its shutdown bound; skipped when testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	px := startFreezer(t, srv.Addr().String())

	bin := filepath.Join(t.TempDir(), "delayd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var log syncBuffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DELAYD_NATS_URL=nats://"+px.addr(), "DELAYD_LEVELS=1s", "DELAYD_HTTP_ADDR=",
		"DELAYD_LOG_FORMAT=json", "DELAYD_LOG_LEVEL=info")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var werr error
	exited := make(chan struct{}) // closed once cmd.Wait returned werr
	go func() { werr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitLog(t, &log, exited, `"msg":"leases gained"`)

	// Messages in flight at the signal: due in 1 s, so the level's scanner
	// is delivering and committing when the server stops answering.
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A delivery to the target, then an offset commit of the level after
	// it: seen on the server, not through the proxy.
	delivered, committed := make(chan struct{}), make(chan struct{})
	var seenDelivery, seenCommit sync.Once
	if _, err := nc.Subscribe("stuck", func(*nats.Msg) { seenDelivery.Do(func() { close(delivered) }) }); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("$KV."+offsets.Bucket+".>", func(m *nats.Msg) {
		select {
		case <-delivered:
		default:
			return // a commit before any delivery: not of the messages in flight
		}
		if key := strings.TrimPrefix(m.Subject, "$KV."+offsets.Bucket+"."); strings.HasPrefix(key, levels.StreamPrefix+"1S") {
			seenCommit.Do(func() { close(committed) })
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	published, stop := make(chan int, 1), make(chan struct{})
	start := time.Now()
	go func() {
		i := 0
		defer func() { published <- i }()
		for ; ; i++ {
			m := &nats.Msg{Subject: "delay.stuck", Header: nats.Header{contract.HeaderLevel: []string{"1"}}, Data: []byte{byte(i)}}
			if _, err := nc.RequestMsg(m, 5*time.Second); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	// The first ones due: deliveries and commits in flight once one of
	// each was seen.
	for _, w := range []struct {
		what string
		seen <-chan struct{}
	}{{"a delivery to stuck", delivered}, {"an offset commit of DELAYD_1S after it", committed}} {
		select {
		case <-w.seen:
			t.Logf("%s seen %v after the first publish", w.what, time.Since(start).Round(10*time.Millisecond))
		case <-exited:
			t.Fatalf("delayd exited before %s; log:\n%s", w.what, log.String())
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s not seen within 2 minutes; log:\n%s", w.what, log.String())
		}
	}
	px.freeze()
	close(stop)
	if n := <-published; n == 0 {
		t.Fatal("nothing published")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	select {
	case <-exited:
	case <-time.After(shutdownTimeout + 2*time.Minute): // liveness only: the bound's own check is the log line
		t.Fatalf("delayd still running %v after SIGTERM, its server frozen; log:\n%s", time.Since(signalled), log.String())
	}
	t.Logf("delayd exited %v after SIGTERM: %v", time.Since(signalled).Round(100*time.Millisecond), werr)
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.ExitCode() != exitError {
		t.Errorf("exit %v after %v, want status %d (shutdown not clean); log:\n%s", werr, time.Since(signalled).Round(time.Second), exitError, log.String())
	}
	if out := log.String(); !strings.Contains(out, msgShutdownBound) && !strings.Contains(out, msgShutdownUnconfirmed) &&
		!strings.Contains(out, msgShutdownConnLost) {
		t.Errorf("log says none of %q, %q and %q; log:\n%s", msgShutdownBound, msgShutdownUnconfirmed, msgShutdownConnLost, out)
	}
}

// waitLog waits until the process's log holds want, failing if it exits first.
func waitLog(t *testing.T, log *syncBuffer, exited <-chan struct{}, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(log.String(), want) {
		select {
		case <-exited:
			t.Fatalf("delayd exited before logging %s; log:\n%s", want, log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in delayd's log within 2 minutes; log:\n%s", want, log.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a process's output and a test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freezer is a TCP proxy to a server; frozen, it keeps every connection
// open and forwards nothing either way, as a server that hangs.
type freezer struct {
	ln     net.Listener
	frozen chan struct{} // closed by freeze
	once   sync.Once
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, frozen: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go f.pipe(s, c)
			go f.pipe(c, s)
		}
	}()
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

// freeze stops all forwarding for good; connections stay open.
func (f *freezer) freeze() { f.once.Do(func() { close(f.frozen) }) }

// pipe copies from src to dst until frozen, then reads and drops, until
// src is closed.
func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			n = 0
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestHTTPAddrInUse: a delayd whose DELAYD_HTTP_ADDR is taken exits with
// status 2 and logs that cause only. (Before, its own drain of the NATS
// connection on the way out was logged as a second, false cause: "NATS
// connection closed; stopping".)
func TestHTTPAddrInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds delayd; skipped when testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taken.Close() })

	bin := filepath.Join(t.TempDir(), "delayd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DELAYD_NATS_URL="+srv.ClientURL(), "DELAYD_LEVELS=1s", "DELAYD_HTTP_ADDR="+taken.Addr().String(),
		"DELAYD_LOG_FORMAT=json", "DELAYD_LOG_LEVEL=info")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitConfig {
		t.Errorf("exit %v, want status %d; log:\n%s", err, exitConfig, out)
	}
	if !bytes.Contains(out, []byte(`"msg":"DELAYD_HTTP_ADDR: cannot listen"`)) {
		t.Errorf("log does not name DELAYD_HTTP_ADDR; log:\n%s", out)
	}
	if n := bytes.Count(out, []byte(`"level":"ERROR"`)); n != 1 {
		t.Errorf("%d ERROR lines, want 1 (the true cause only); log:\n%s", n, out)
	}
}
