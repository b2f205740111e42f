//go:build unix

package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
)

// This file runs delayd replicas as separate OS processes, as a user runs
// them: the delayd binary (built once per test binary by itest.DelaydBinary, with
// the race detector if the test binary has it), configured only through DELAYD_* variables, against a
// NATS cluster's client URLs. A test signals a replica by PID: kill -9,
// SIGSTOP, SIGCONT, SIGTERM. Each replica's log goes to the test log, one
// line per log record, prefixed with the replica's name and generation
// ("r0.2 | ..."), and the harness reads the log for what only the replica
// knows: its HTTP address and the NATS URL it is connected to.

// replicaLevelsDefault is the level table replicas get unless the test
// gives DELAYD_LEVELS: short levels, so that messages fall due during a
// fault and the test ends soon.
const replicaLevelsDefault = "200ms 1s 2s"

// replica is one delayd replica: a name, an environment and, at any time,
// at most one running process (a generation). Restart starts a new
// generation with the same environment. A replica belongs to the test's
// goroutine; its log is read concurrently.
type replica struct {
	t    *testing.T
	name string
	env  []string

	gen    int
	cmd    *exec.Cmd
	log    *replicaLog
	logs   []*replicaLog // every generation's
	exited chan struct{} // closed when the current process has exited
	state  *os.ProcessState
}

// startReplica starts a delayd replica named name (for the log) against
// natsURL (comma-separated client URLs, as DELAYD_NATS_URL takes them),
// with DELAYD_REPLICAS=3, the HTTP endpoints on a free loopback port, JSON
// logs at info level (debug with DELAYD_TEST_DEBUG=1), DELAYD_LEVELS
// [replicaLevelsDefault], then env (later entries win; DELAYD_* variables of
// the test's own environment are not passed on). It returns once the
// process has started; see [replica.waitReady]. The process is killed and
// reaped when the test ends.
func startReplica(t *testing.T, name, natsURL string, env ...string) *replica {
	t.Helper()
	level := "info"
	if os.Getenv("DELAYD_TEST_DEBUG") != "" {
		level = "debug"
	}
	r := &replica{t: t, name: name, env: append([]string{
		"DELAYD_NATS_URL=" + natsURL,
		"DELAYD_REPLICAS=3",
		"DELAYD_HTTP_ADDR=127.0.0.1:0",
		"DELAYD_LOG_FORMAT=json",
		"DELAYD_LOG_LEVEL=" + level,
		"DELAYD_LEVELS=" + replicaLevelsDefault,
	}, env...)}
	t.Cleanup(r.reap)
	r.start()
	return r
}

// start starts a new generation. The previous one must have exited.
func (r *replica) start() {
	r.t.Helper()
	bin, err := itest.DelaydBinary()
	if err != nil {
		r.t.Fatal(err)
	}
	r.gen++
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, r.env...)
	cmd.SysProcAttr = childProcAttr()
	lg := newReplicaLog(r.t, fmt.Sprintf("%s.%d", r.name, r.gen))
	cmd.Stdout, cmd.Stderr = lg, lg // one pipe: lines stay whole
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("%s: start delayd: %v", r.name, err)
	}
	r.cmd, r.log, r.exited, r.state = cmd, lg, make(chan struct{}), nil
	r.logs = append(r.logs, lg)
	exited := r.exited
	go func() {
		_ = cmd.Wait() // also waits until every log line is written
		lg.flush()
		close(exited)
	}()
	r.t.Logf("%s: started delayd generation %d, PID %d", r.name, r.gen, cmd.Process.Pid)
}

// PID returns the current process's ID.
func (r *replica) PID() int { return r.cmd.Process.Pid }

// running reports whether the current process has not exited.
func (r *replica) running() bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the current process.
func (r *replica) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("%s: %s to PID %d: %v", r.name, sig, r.PID(), err)
	}
}

// wait waits up to timeout for the current process to exit and returns how
// it ended.
func (r *replica) wait(timeout time.Duration) *os.ProcessState {
	r.t.Helper()
	select {
	case <-r.exited:
	case <-time.After(timeout):
		r.t.Fatalf("%s: PID %d did not exit within %s", r.name, r.PID(), timeout)
	}
	r.state = r.cmd.ProcessState
	return r.state
}

// kill9 kills the current process with SIGKILL and waits until it is gone.
// It fails the test if the process had already exited by itself.
func (r *replica) kill9() {
	r.t.Helper()
	if !r.running() {
		r.t.Fatalf("%s: PID %d had exited before kill -9: %s", r.name, r.PID(), r.cmd.ProcessState)
	}
	r.signal(syscall.SIGKILL)
	st := r.wait(10 * time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		r.t.Fatalf("%s: PID %d ended %s, not by SIGKILL", r.name, r.PID(), st)
	}
	r.t.Logf("%s: kill -9 PID %d", r.name, r.PID())
}

// pause stops the current process with SIGSTOP. It stays stopped until
// resume (or is killed at cleanup).
//
// A signal is delivered asynchronously: kill(2) returns before the
// process's threads have stopped, and a thread already running may answer
// a request first. pause returns once every thread of the process shows
// the stopped state in /proc (where there is a /proc), so that what the
// test does next meets a stopped process.
func (r *replica) pause() {
	r.t.Helper()
	r.signal(syscall.SIGSTOP)
	r.t.Logf("%s: SIGSTOP PID %d", r.name, r.PID())
	if _, err := os.Stat("/proc/self/task"); err != nil {
		return // no /proc: nothing to read the state from
	}
	itest.WaitFor(r.t, 10*time.Second, fmt.Sprintf("every thread of PID %d to stop", r.PID()), func() bool {
		return allThreadsStopped(r.PID())
	})
}

// allThreadsStopped reports whether every thread of the process pid is in
// the stopped state ("T" in /proc/<pid>/task/<tid>/stat; proc(5)).
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name in parentheses, which may
		// itself hold spaces or parentheses: read after the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// resume continues a stopped process with SIGCONT.
func (r *replica) resume() {
	r.t.Helper()
	r.signal(syscall.SIGCONT)
	r.t.Logf("%s: SIGCONT PID %d", r.name, r.PID())
}

// term sends SIGTERM (a graceful shutdown) and waits up to timeout for the
// exit. It returns nil for exit status 0, else an error with the status.
func (r *replica) term(timeout time.Duration) error {
	r.t.Helper()
	r.signal(syscall.SIGTERM)
	st := r.wait(timeout)
	r.t.Logf("%s: SIGTERM PID %d: %s", r.name, r.PID(), st)
	if !st.Success() {
		return fmt.Errorf("%s: PID %d after SIGTERM: %s", r.name, r.PID(), st)
	}
	return nil
}

// restart starts a new generation with the same environment. The current
// process must have exited (kill9, term).
func (r *replica) restart() {
	r.t.Helper()
	if r.running() {
		r.t.Fatalf("%s: restart while PID %d runs", r.name, r.PID())
	}
	r.start()
}

// reap kills the current process if it still runs (SIGCONT first, in case
// it is stopped) and waits for it, so no process outlives the test. Then it
// fails the test if any generation reported a data race.
func (r *replica) reap() {
	if r.cmd == nil {
		return
	}
	if r.running() {
		_ = r.cmd.Process.Signal(syscall.SIGCONT)
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-r.exited:
		case <-time.After(30 * time.Second):
			r.t.Errorf("%s: PID %d not reaped within 30s", r.name, r.PID())
		}
	}
	for i, lg := range r.logs {
		if n := lg.races(); n > 0 {
			r.t.Errorf("%s: generation %d reported %d data races (see its log)", r.name, i+1, n)
		}
	}
}

// httpAddr waits up to timeout until the current process logs its HTTP
// address (DELAYD_HTTP_ADDR picks a free port) and returns it, host:port.
func (r *replica) httpAddr(timeout time.Duration) string {
	r.t.Helper()
	return r.waitLog("http endpoints", time.Time{}, timeout).attr("addr")
}

// get sends GET path (e.g. "/readyz", "/metrics") to the current process's
// HTTP endpoints, with a one-second timeout, and returns the status code and
// body.
func (r *replica) get(path string) (int, string, error) {
	r.t.Helper()
	addr := r.httpAddr(time.Minute)
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, err = body.ReadFrom(resp.Body)
	return resp.StatusCode, body.String(), err
}

// waitReady waits up to timeout until the current process's /readyz
// answers 200. It fails the test if the process exits first.
func (r *replica) waitReady(timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	r.httpAddr(timeout)
	last := "no answer"
	for {
		if !r.running() {
			r.t.Fatalf("%s: PID %d exited before ready: %s", r.name, r.PID(), r.cmd.ProcessState)
		}
		code, body, err := r.get("/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body)); err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: PID %d not ready within %s: /readyz %s", r.name, r.PID(), timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connectedURL returns the NATS URL the current process last logged it
// connected or reconnected to, or "" if it has not connected yet or logged
// a disconnect since.
func (r *replica) connectedURL() string {
	url := ""
	for _, e := range r.log.events() {
		switch e.msg {
		case "connected to NATS", "reconnected to NATS":
			url = e.attr("url")
		case "disconnected from NATS":
			url = ""
		}
	}
	return url
}

// waitConnected waits up to timeout until the current process is connected
// (see connectedURL) and returns the URL.
func (r *replica) waitConnected(timeout time.Duration) string {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if url := r.connectedURL(); url != "" {
			return url
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: PID %d not connected to NATS within %s", r.name, r.PID(), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog waits up to timeout until the current process logs a record with
// message msg and a time at or after since, and returns it.
func (r *replica) waitLog(msg string, since time.Time, timeout time.Duration) logEvent {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, e := range r.log.events() {
			if e.msg == msg && !e.logged.Before(since) {
				return e
			}
		}
		if !r.running() {
			r.t.Fatalf("%s: PID %d exited before logging %q: %s", r.name, r.PID(), msg, r.cmd.ProcessState)
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: PID %d logged no %q within %s", r.name, r.PID(), msg, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logEvent is one JSON log record of a replica.
type logEvent struct {
	at     time.Time // when the test read it
	logged time.Time // its "time" (the replica's clock is the test's): at if missing
	msg    string
	level  string
	fields map[string]any
}

// attr returns the record's attribute key as a string ("" if missing).
func (e logEvent) attr(key string) string {
	switch v := e.fields[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// replicaLog is an io.Writer for a process's stdout and stderr: it passes
// each line to the test log with a prefix and keeps each JSON record.
type replicaLog struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
	evs    []logEvent
	nraces int
	// hush: lines after the test's body has ended are not logged (kept
	// for events and race counts): a nats-server's lines while the
	// cleanup kills the cluster would bury the failure above them.
	hush bool
}

func newReplicaLog(t *testing.T, prefix string) *replicaLog {
	return &replicaLog{t: t, prefix: prefix}
}

func (l *replicaLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.line(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

// flush passes on a last line without a newline.
func (l *replicaLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.line(l.buf)
		l.buf = nil
	}
}

// line handles one line; l.mu is held.
func (l *replicaLog) line(b []byte) {
	if !l.hush || l.t.Context().Err() == nil {
		l.t.Logf("%s | %s", l.prefix, b)
	}
	if bytes.Contains(b, []byte("WARNING: DATA RACE")) {
		l.nraces++
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		return // not a log record: a panic, the race detector's report
	}
	e := logEvent{at: time.Now(), fields: rec}
	e.logged = e.at
	if ts, ok := rec["time"].(string); ok {
		if lt, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			e.logged = lt
		}
	}
	e.msg, _ = rec["msg"].(string)
	e.level, _ = rec["level"].(string)
	l.evs = append(l.evs, e)
}

func (l *replicaLog) events() []logEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logEvent(nil), l.evs...)
}

// races returns how many data race reports the process wrote (none unless
// the binary is built with -race: itest.Race).
func (l *replicaLog) races() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nraces
}
