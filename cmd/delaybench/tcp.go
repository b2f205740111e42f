package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The -tcp mode: every server is a nats-server process on loopback, every
// connection goes over TCP, and delayd runs as its own process (cmd/delayd
// with DELAYD_NATS_URL), the way users deploy it. Both binaries are built
// once per run with the go command from the module cache (offline), so
// delaybench must run inside the module (go run ./cmd/delaybench -tcp).

// tcpScenarios are the scenarios -tcp runs: pending reads this process's
// heap (delayd's is another process's) and cluster starts its nodes
// in-process.
var tcpScenarios = []string{"raw", "ref", "ingest", "burst", "burst-1m", "steady", "cancel-storm", "cross-level", "sustained"}

// tcpBins are the binaries of the -tcp mode.
type tcpBins struct {
	once       sync.Once
	err        error
	natsServer string
	delayd     string
}

// binaries builds nats-server (the version in go.mod) and delayd into the
// run's root, once.
func (b *bench) binaries() (*tcpBins, error) {
	t := &b.tcp
	t.once.Do(func() {
		dir := filepath.Join(b.root, "bin")
		t.natsServer, t.delayd = filepath.Join(dir, "nats-server"), filepath.Join(dir, "delayd")
		for _, pkg := range []struct{ out, pkg string }{
			{t.natsServer, "github.com/nats-io/nats-server/v2"},
			{t.delayd, "github.com/delayd/delayd/cmd/delayd"},
		} {
			b.logf("tcp: go build -o %s %s", pkg.out, pkg.pkg)
			out, err := exec.Command("go", "build", "-o", pkg.out, pkg.pkg).CombinedOutput()
			if err != nil {
				t.err = fmt.Errorf("go build %s (run delaybench inside the delayd module): %v\n%s", pkg.pkg, err, out)
				return
			}
		}
	})
	return t, t.err
}

// proc is a process this run started, its output in a log file.
type proc struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan error
}

// startProc starts bin with args and the extra environment, its output
// to logPath.
func startProc(bin, logPath string, env []string, args ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, log: f, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// stop sends SIGTERM and waits up to grace for the exit, then kills the
// process (by its PID). It returns the exit error of a process that did
// not exit cleanly on SIGTERM.
func (p *proc) stop(grace time.Duration) error {
	defer p.log.Close()
	select {
	case err := <-p.done:
		return fmt.Errorf("%s exited before it was stopped: %v", filepath.Base(p.cmd.Path), err)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %s of SIGTERM: killed", filepath.Base(p.cmd.Path), grace)
	}
}

// tail is the last lines of the process's log, for an error.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log.Name())
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// startNATSProcess starts a JetStream nats-server process on a loopback
// port the OS picks, storing in e.dir, and sets e.url from its ports file.
func (b *bench) startNATSProcess(e *env) error {
	bins, err := b.binaries()
	if err != nil {
		return err
	}
	p, err := startProc(bins.natsServer, filepath.Join(e.dir, "nats-server.log"), nil,
		"-a", "127.0.0.1", "-p", "-1", "-js", "-sd", filepath.Join(e.dir, "store"), "--ports_file_dir", e.dir)
	if err != nil {
		return err
	}
	e.natsProc = p
	portsFile := filepath.Join(e.dir, fmt.Sprintf("nats-server_%d.ports", p.cmd.Process.Pid))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ports struct {
			Nats []string `json:"nats"`
		}
		if data, err := os.ReadFile(portsFile); err == nil && json.Unmarshal(data, &ports) == nil && len(ports.Nats) > 0 {
			e.url = ports.Nats[0]
			return nil
		}
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("nats-server exited at start: %v\n%s", err, p.tail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server wrote no ports file within 30s\n%s", p.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startDelaydProcess runs the delayd binary with the level table against
// e's server (DELAYD_NATS_URL) and an HTTP address of its own on loopback,
// and waits until /readyz answers 200.
func (e *env) startDelaydProcess(ctx context.Context, table string) (*service, error) {
	bins, err := e.bench.binaries()
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.services++
	logPath := filepath.Join(e.dir, fmt.Sprintf("delayd-%d.log", e.services))
	e.mu.Unlock()
	env := []string{"DELAYD_NATS_URL=" + e.url, "DELAYD_HTTP_ADDR=" + addr, "DELAYD_LEVELS=" + table, "DELAYD_PREFIX=" + prefix}
	if share := e.bench.cfg.CancelShare; share > 0 {
		env = append(env, "DELAYD_CANCEL_SHARE="+strconv.FormatFloat(share, 'g', -1, 64))
	}
	if keep := e.bench.cfg.AnswerKeep; keep != "" {
		env = append(env, "DELAYD_ANSWER_KEEP="+keep)
	}
	p, err := startProc(bins.delayd, logPath, env)
	if err != nil {
		return nil, err
	}
	s := &service{proc: p}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		if resp, err := client.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("delayd exited before ready: %v\n%s", err, p.tail())
		case <-ctx.Done():
			_ = p.stop(10 * time.Second)
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = p.stop(10 * time.Second)
			return nil, errors.New("delayd not ready within 1 min\n" + p.tail())
		}
	}
}

// freeAddr is a loopback address with a port the OS just gave out.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
