//go:build unix

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// natsServerBinary builds nats-server from the module's own dependency
// (the version in go.mod) once per test binary, without the race detector:
// the tests kill its processes, they do not test it.
var natsServerBinary = sync.OnceValues(func() (string, error) {
	return itest.BuildBinary("github.com/nats-io/nats-server/v2", "nats-server", false)
})

// procCluster is a JetStream cluster of nats-server processes on loopback,
// each with a generated config file (server name N<i>, a client port, a
// monitoring port, a cluster port with routes to every node, a store dir),
// so a test can kill a node with SIGKILL: its peers and clients see its
// connections drop without a goodbye, as when a machine dies. Ports are
// chosen free once and kept across restarts.
type procCluster struct {
	t     *testing.T
	bin   string
	confs []string
	ports []int // client ports
	mons  []int // monitoring ports
	cmds  []*exec.Cmd
	done  []chan struct{} // closed when node i's current process exited
}

// startProcCluster starts n nodes (3 for R3) and waits until each answers
// /healthz with 200 (JetStream current). Every node is killed when the
// test ends.
func startProcCluster(t *testing.T, n int) *procCluster {
	t.Helper()
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 3*n)
	var lns []net.Listener // held until every port is chosen, so that none repeats
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range lns {
		_ = l.Close()
	}
	c := &procCluster{t: t, bin: bin, ports: ports[:n], mons: ports[n : 2*n], cmds: make([]*exec.Cmd, n), done: make([]chan struct{}, n)}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[2*n+i]))
	}
	dir := t.TempDir()
	for i := range n {
		conf := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		text := fmt.Sprintf(`server_name: N%d
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster {
  name: CPROC
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, i, ports[i], ports[n+i], filepath.Join(dir, fmt.Sprintf("store%d", i)), ports[2*n+i], strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		c.confs = append(c.confs, conf)
	}
	t.Cleanup(func() {
		for i := range c.cmds {
			c.kill(i)
		}
	})
	for i := range n {
		c.start(i)
	}
	for i := range n {
		c.waitHealthy(i)
	}
	return c
}

func (c *procCluster) start(i int) {
	c.t.Helper()
	cmd := exec.Command(c.bin, "-c", c.confs[i])
	cmd.SysProcAttr = childProcAttr()
	lg := newReplicaLog(c.t, fmt.Sprintf("N%d", i))
	lg.hush = true
	cmd.Stdout, cmd.Stderr = lg, lg
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start nats-server N%d: %v", i, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); lg.flush(); close(done) }()
	c.cmds[i], c.done[i] = cmd, done
	c.t.Logf("N%d: started nats-server, PID %d", i, cmd.Process.Pid)
}

// kill kills node i's process with SIGKILL, if it runs, and waits for it.
func (c *procCluster) kill(i int) {
	if c.cmds[i] == nil {
		return
	}
	_ = c.cmds[i].Process.Signal(syscall.SIGKILL)
	select {
	case <-c.done[i]:
	case <-time.After(30 * time.Second):
		c.t.Errorf("N%d: PID %d not gone 30s after SIGKILL", i, c.cmds[i].Process.Pid)
	}
	c.cmds[i] = nil
}

// Kill9 kills node i with SIGKILL.
func (c *procCluster) Kill9(i int) {
	c.t.Helper()
	pid := c.cmds[i].Process.Pid
	c.kill(i)
	c.t.Logf("N%d: kill -9 PID %d", i, pid)
}

// Restart starts killed node i again with its config and store, and waits
// until it is healthy.
func (c *procCluster) Restart(i int) {
	c.t.Helper()
	if c.cmds[i] != nil {
		c.t.Fatalf("N%d runs", i)
	}
	c.start(i)
	c.waitHealthy(i)
}

// waitHealthy waits up to a minute until node i's /healthz answers 200
// (nats-server: JetStream enabled and current with its cluster).
func (c *procCluster) waitHealthy(i int) {
	c.t.Helper()
	client := &http.Client{Timeout: time.Second}
	itest.WaitFor(c.t, time.Minute, fmt.Sprintf("N%d healthy", i), func() bool {
		select {
		case <-c.done[i]:
			c.t.Fatalf("N%d: nats-server exited: %s", i, c.cmds[i].ProcessState)
		default:
		}
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", c.mons[i]))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// URL returns node i's client URL.
func (c *procCluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.ports[i]) }

// URLs returns every node's client URL, comma-separated.
func (c *procCluster) URLs() string {
	var urls []string
	for i := range c.ports {
		urls = append(urls, c.URL(i))
	}
	return strings.Join(urls, ",")
}

// NodeOf returns the index of the node whose client URL url is (as
// nats.go reports a connected URL), or -1.
func (c *procCluster) NodeOf(url string) int {
	for i := range c.ports {
		if strings.TrimPrefix(url, "nats://") == strings.TrimPrefix(c.URL(i), "nats://") {
			return i
		}
	}
	return -1
}

// StreamLeader returns the index of the node that leads stream, asked
// through js (stream info's cluster leader, "N<i>"), or -1 if none does
// or the question fails.
func (c *procCluster) StreamLeader(js jetstream.JetStream, stream string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return -1
	}
	for i := range c.ports {
		if info.Cluster.Leader == fmt.Sprintf("N%d", i) {
			return i
		}
	}
	return -1
}

// Connect returns a connection to node i (reconnecting for ever, to any
// node; closed when the test ends) and its JetStream context.
func (c *procCluster) Connect(i int) (*nats.Conn, jetstream.JetStream) {
	c.t.Helper()
	urls := make([]string, len(c.ports))
	for j := range c.ports {
		urls[j] = c.URL(j)
	}
	return natstest.ConnectNode(c.t, urls, i)
}

// WaitCurrent waits up to timeout until, as js sees it, every stream
// (level streams, buckets, the test's) has a leader and every follower is
// current, so that the next node killed does not take a stream's last
// current copy or its quorum. It returns how long that took. It fails the
// test with the last reason seen after timeout (three times under the
// race detector: [itest.Liveness]).
func (c *procCluster) WaitCurrent(js jetstream.JetStream, timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	last := "no answer"
	current := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l := js.ListStreams(ctx)
		n := 0
		for info := range l.Info() {
			n++
			if info.Cluster == nil || info.Cluster.Leader == "" {
				last = info.Config.Name + " has no leader"
				return false
			}
			if len(info.Cluster.Replicas) != len(c.ports)-1 {
				last = fmt.Sprintf("%s has %d followers", info.Config.Name, len(info.Cluster.Replicas))
				return false
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Offline {
					last = fmt.Sprintf("%s: follower %s not current", info.Config.Name, r.Name)
					return false
				}
			}
		}
		if l.Err() != nil || n == 0 {
			last = fmt.Sprintf("stream list: %v", l.Err())
			return false
		}
		return true
	}
	timeout = itest.Liveness(timeout)
	for !current() {
		if time.Since(start) > timeout {
			c.t.Fatalf("timed out after %s waiting for every stream led and current (last seen: %s)", timeout, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(start); d > time.Second {
		c.t.Logf("every stream led and current after %s (last seen: %s)", d.Round(time.Millisecond), last)
	}
	return time.Since(start)
}
