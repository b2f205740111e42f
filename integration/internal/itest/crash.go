package itest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// killLeaseTTL is the lease TTL of the kill -9 tests' delayd processes: a
// process started after a SIGKILL routes and delivers only once its dead
// predecessor's leases have been unchanged that long
// (docs/guarantees.md#a-restart-after-a-crash), so each kill comes that much later
// than before leases, and the TTL is shorter than the default to keep the
// tests' length.
const (
	KillLeaseTTL    = 500 * time.Millisecond
	KillLeaseTTLEnv = "DELAYD_LEASE_TTL=500ms"
)

// Process is delayd running as a separate OS process.
type Process struct {
	Cmd *exec.Cmd
	Out *SyncWriter // its stdout and stderr
}

// StartProcess runs the delayd binary against the test's server, with the
// lease TTL [LeaseTTL] unless env sets DELAYD_LEASE_TTL. Call it
// from the test's goroutine only; other goroutines use tryStartProcess.
func (b *Bundle) StartProcess(env ...string) *Process {
	b.T.Helper()
	p, err := b.TryStartProcess(env...)
	if err != nil {
		b.T.Fatal(err)
	}
	return p
}

// TryStartProcess is startProcess returning its error instead of failing the
// test, for goroutines other than the test's.
func (b *Bundle) TryStartProcess(env ...string) (*Process, error) {
	bin, err := DelaydBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"DELAYD_NATS_URL="+b.Srv.ClientURL(),
		"DELAYD_HTTP_ADDR=",
		"DELAYD_LOG_FORMAT=json",
		"DELAYD_LOG_LEVEL=warn",
		// Cancel tests check answers, not pacing: lookups may take a
		// whole core (the default paces them to a tenth:
		// TestCancelStormAnswered, and deliver/internal/cancelapi's TestLookupPacer).
		"DELAYD_CANCEL_SHARE=1",
		"DELAYD_LEASE_TTL="+LeaseTTL.String(), // env may set another (KillLeaseTTLEnv): the last value counts
	)
	cmd.Env = append(cmd.Env, env...)
	out := &SyncWriter{W: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start delayd: %w", err)
	}
	p := &Process{Cmd: cmd, Out: out}
	b.T.Cleanup(func() { _ = p.Cmd.Process.Kill(); _ = p.Cmd.Wait() })
	return p, nil
}

// SyncWriter is a bytes.Buffer W safe for concurrent writes and reads
// (a process's stdout and stderr, a test's log reader).
type SyncWriter struct {
	mu sync.Mutex
	W  *bytes.Buffer
}

// Write appends p to W under the writer's lock.
func (s *SyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.W.Write(p)
}

// String returns everything written so far.
func (s *SyncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.W.String()
}
