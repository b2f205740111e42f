//go:build long && gray && unix

package cluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// Tests of a NATS node that hangs (SIGSTOP) or dies (SIGKILL) under three
// delayd replicas, issue 19 item 1: its acceptance tests, behind the tags
// long and gray (go test -tags long,gray). They do not pass yet: stalls
// exceed their bounds and a stream target with a duplicate window shorter
// than the hang sees duplicates (docs/operations.md#what-each-failure-costs
// has the figures), so CI does not run them until they do
// (docs/development.md#tests). Each measures, in the same run, how
// long JetStream takes to move the leaders the hung node held (every
// stream's leader polled from the test's client on node 0, which is never
// hung), and bounds each level's longest delivery gap by it.

// nodeHang is how long a node stays stopped: well past the time JetStream
// takes to move its leaders, nats.go's stale-connection detection and the
// core target's duplicate window, so that a stall bound by the hang (the
// fault issue 19 found) cannot pass for one bound by the elections.
const nodeHang = 60 * time.Second

// pause stops node i with SIGSTOP: its sockets stay open, nothing answers.
func (c *procCluster) pause(i int) {
	c.t.Helper()
	if err := c.cmds[i].Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatalf("N%d: SIGSTOP: %v", i, err)
	}
	c.t.Logf("N%d: SIGSTOP PID %d", i, c.cmds[i].Process.Pid)
}

// resume continues node i with SIGCONT.
func (c *procCluster) resume(i int) {
	c.t.Helper()
	if err := c.cmds[i].Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatalf("N%d: SIGCONT: %v", i, err)
	}
	c.t.Logf("N%d: SIGCONT PID %d", i, c.cmds[i].Process.Pid)
}

// streamLeaders returns the leader node of every stream, asked through js
// (-1 where the question fails).
func (c *procCluster) streamLeaders(js jetstream.JetStream) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]int{}
	for name := range js.StreamNames(ctx).Name() {
		out[name] = c.StreamLeader(js, name)
	}
	return out
}

// leaderWatch polls, from the fault on, the leader of every stream node
// led before it, until stopped; moved is when each was first seen led by
// another node.
type leaderWatch struct {
	mu    sync.Mutex
	moved map[string]time.Duration // stream -> time from the fault to its new leader
	led   []string                 // the streams node led at the fault
	stop  chan struct{}
	done  sync.WaitGroup
}

// watchLeaders starts polling the leaders of the streams in led (those
// node led) every 100 ms each, from at.
func (c *procCluster) watchLeaders(nc *nats.Conn, led []string, node int, at time.Time) *leaderWatch {
	w := &leaderWatch{moved: map[string]time.Duration{}, led: led, stop: make(chan struct{})}
	for _, s := range led {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				// STREAM.INFO is answered by the stream's leader only: a
				// reply naming a leader other than node is a moved leader.
				m, err := nc.Request("$JS.API.STREAM.INFO."+s, nil, time.Second)
				if err == nil && !strings.Contains(string(m.Data), fmt.Sprintf(`"leader":"N%d"`, node)) && strings.Contains(string(m.Data), `"leader":"N`) {
					w.mu.Lock()
					w.moved[s] = time.Since(at)
					w.mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	return w
}

// finish stops the watch and returns the slowest move (the hang's whole
// length for a stream never seen moved) and a description.
func (w *leaderWatch) finish(hang time.Duration) (time.Duration, string) {
	close(w.stop)
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	var slowest time.Duration
	var parts []string
	for _, s := range w.led {
		d, ok := w.moved[s]
		if !ok {
			d = hang
			parts = append(parts, s+" never moved")
		} else {
			parts = append(parts, fmt.Sprintf("%s %s", s, d.Round(time.Millisecond)))
		}
		slowest = max(slowest, d)
	}
	sort.Strings(parts)
	return slowest, strings.Join(parts, ", ")
}

// ledBy returns the streams node leads in leaders.
func ledBy(leaders map[string]int, node int) []string {
	var out []string
	for s, n := range leaders {
		if n == node {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// moveLeaderTo asks the leader of stream to step down, preferring node,
// until node leads it. It fails the test after a minute.
func moveLeaderTo(t *testing.T, c *procCluster, nc *nats.Conn, js jetstream.JetStream, stream string, node int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	req := fmt.Sprintf(`{"placement":{"preferred":"N%d"}}`, node)
	for c.StreamLeader(js, stream) != node {
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), 5*time.Second) // a failed request is tried again
		if time.Now().After(deadline) {
			t.Fatalf("stream %s not led by node %d after a minute", stream, node)
		}
		time.Sleep(500 * time.Millisecond) // pacing: an election takes a moment
	}
}

// nodeFault is one fault of a node test, and what it measured.
type nodeFault struct {
	name     string
	node     int
	at       time.Time
	election time.Duration // the slowest leader move it needed
	moves    string
}

// hangTest is the set-up the node tests share: a 3-node cluster, three
// replicas on nodes 1 and 2 (node 0 is the test client's and is never
// touched), a load.
type hangTest struct {
	t   *testing.T
	c   *procCluster
	nc  *nats.Conn
	js  jetstream.JetStream
	rs  []*replica
	l   *load
	cfg loadConfig
}

func startHangTest(t *testing.T, total int) *hangTest {
	c := startProcCluster(t, 3)
	nc, js := c.Connect(0)
	var rs []*replica
	for i := range 3 {
		rs = append(rs, startReplica(t, fmt.Sprintf("r%d", i), c.URL(1)+","+c.URL(2)))
	}
	for _, r := range rs {
		r.waitReady(time.Minute)
	}
	waitOwner(t, rs, routerKey, time.Minute)
	// The target's duplicate window is shorter than the hang: a delivery
	// the hung node holds in its sockets and stores on SIGCONT, after the
	// new owner delivered it, would not be taken for a duplicate.
	cfg := loadConfig{Total: total, Rate: 500, Levels: clusterLevels, TargetDuplicates: nodeHang / 3}
	l := newLoad(t, nc, js, cfg)
	c.WaitCurrent(js, 2*time.Minute)
	l.start()
	return &hangTest{t: t, c: c, nc: nc, js: js, rs: rs, l: l, cfg: cfg}
}

// check waits for the load to end and checks it: nothing lost, early or
// doubled at the stream target, every level stream written once per
// message, core re-deliveries within a scanner window per level per fault;
// then each fault's levels' longest delivery gap against its election
// plus slack.
func (h *hangTest) check(faults []nodeFault, slack time.Duration) {
	t := h.t
	h.l.waitPublished(5 * time.Minute)
	h.l.waitDelivered(2 * time.Minute)
	rep := h.l.report()
	t.Logf("load:\n%s", rep)
	var marks []faultMark
	for _, f := range faults {
		marks = append(marks, faultMark{name: f.name, at: f.at, levels: []int{1, 2, 3}})
	}
	figs, _ := failoverFigures(h.l.levelDeliveries(), h.cfg.Levels, marks, 2*nodeHang)
	logFailovers(t, h.l, marks, 2*nodeHang)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, len(faults), deliver.ScannerWindowDefault, clusterLevels)
	for k, f := range faults {
		bound := f.election + slack
		var gaps []string
		for _, fig := range figs[3*k : 3*k+3] {
			gaps = append(gaps, fmt.Sprintf("%s: %s", fig.level, fig.gap.Round(time.Millisecond)))
			if fig.gap > bound {
				t.Errorf("%s (node %d): level %s stalled %s (from %s after the fault), more than the slowest leader move it needed (%s) plus %s",
					f.name, f.node, fig.level, fig.gap.Round(time.Millisecond), fig.gapFrom.Round(time.Millisecond), f.election.Round(time.Millisecond), slack)
			}
		}
		t.Logf("FIGURES %s (node %d): slowest leader move %s; longest gap by level %s; bound %s", f.name, f.node,
			f.election.Round(time.Millisecond), strings.Join(gaps, ", "), bound.Round(time.Millisecond))
	}
}

// TestReplicasNodeHang stops a NATS node with SIGSTOP for 60 s, mid-load
// with three replicas, in turn: the node the router's holder is connected
// to, the leader of the lease bucket, and the leader of a busy level
// stream (each moved off node 0 first), then continues it. Each level's
// longest delivery gap from the hang is at most the slowest move of a
// leader the hung node held (measured in the same run) plus 5 s, whatever
// the hang's length; the load's checks hold (nothing lost, early or
// doubled at the stream target; core re-deliveries within one scanner
// window per level per fault, docs/guarantees.md#at-least-once). The hang outlasts
// the stream target's duplicate window (20 s here): what the hung node held in its
// sockets (the old holders' writes) and applies on SIGCONT, after the new
// holders took over, is fenced (the stream checks would see a double or a
// loss; itest.WatchOffsets an offset moving back).
func TestReplicasNodeHang(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test with three replicas on a 3-node cluster: skipped when testing.Short()")
	}
	h := startHangTest(t, 6*int(nodeHang/time.Second)*500) // 6 minutes: three hangs and their recoveries
	offs := itest.WatchOffsets(t, h.js)
	levelStream := clusterLevels.Levels()[1].Stream()
	steps := []struct {
		name string
		node func() int
	}{
		{"the router holder's node", func() int {
			o, _ := waitOwner(t, h.rs, routerKey, time.Minute)
			n := h.c.NodeOf(h.rs[o].waitConnected(time.Minute))
			if n <= 0 {
				t.Fatalf("%s (the router's holder) is connected to %q: node %d, not node 1 or 2", h.rs[o].name, h.rs[o].connectedURL(), n)
			}
			return n
		}},
		{"the leader of the lease bucket", func() int { return moveLeaderOff(t, h.c, h.nc, h.js, "KV_DELAYD_LEASES", 0) }},
		{"the leader of " + levelStream, func() int { return moveLeaderOff(t, h.c, h.nc, h.js, levelStream, 0) }},
	}
	var faults []nodeFault
	for k, step := range steps {
		h.l.waitAcked((k+1)*h.cfg.Total/20, 3*time.Minute)
		h.l.waitCaughtUp(2 * time.Minute)
		node := step.node()
		leaders := h.c.streamLeaders(h.js)
		led := ledBy(leaders, node)
		t.Logf("before the hang of %s (node %d): it leads %v", step.name, node, led)
		at := time.Now()
		h.c.pause(node)
		h.l.nodeKilled(at)
		w := h.c.watchLeaders(h.nc, led, node, at)
		time.Sleep(nodeHang)
		election, moves := w.finish(nodeHang)
		h.c.resume(node)
		t.Logf("hung %s (node %d) %s; leader moves: %s", step.name, node, time.Since(at).Round(time.Millisecond), moves)
		faults = append(faults, nodeFault{name: "hang of " + step.name, node: node, at: at, election: election, moves: moves})
		h.c.waitHealthy(node)
		h.c.WaitCurrent(h.js, 2*time.Minute)
	}
	h.check(faults, 5*time.Second)
	t.Logf("%d offset updates seen", offs.Check())
}

// TestReplicasNodeKill9Leaders kills (SIGKILL) a NATS node that leads both
// the lease bucket and a busy level stream, mid-load with three replicas:
// each level's longest delivery gap is at most the slower of the two
// elections (measured in the same run) plus 3 s; the load's checks hold.
func TestReplicasNodeKill9Leaders(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test with three replicas on a 3-node cluster: skipped when testing.Short()")
	}
	h := startHangTest(t, 40000)
	offs := itest.WatchOffsets(t, h.js)
	levelStream := clusterLevels.Levels()[1].Stream()
	h.l.waitAcked(h.cfg.Total/3, 3*time.Minute)
	h.l.waitCaughtUp(2 * time.Minute)
	const node = 1
	moveLeaderTo(t, h.c, h.nc, h.js, "KV_DELAYD_LEASES", node)
	moveLeaderTo(t, h.c, h.nc, h.js, levelStream, node)
	h.c.WaitCurrent(h.js, 2*time.Minute)
	h.l.waitCaughtUp(2 * time.Minute)
	led := []string{"KV_DELAYD_LEASES", levelStream}
	at := time.Now()
	h.c.Kill9(node)
	h.l.nodeKilled(at)
	w := h.c.watchLeaders(h.nc, led, node, at)
	itest.WaitFor(t, time.Minute, "both leaders moved", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.moved) == len(led)
	})
	election, moves := w.finish(time.Minute)
	t.Logf("killed node %d (leader of %v); leader moves: %s", node, led, moves)
	time.Sleep(20 * time.Second) // deliveries resume under the new leaders before the node returns
	h.c.Restart(node)
	h.c.WaitCurrent(h.js, 2*time.Minute)
	h.check([]nodeFault{{name: "kill -9 of the lease bucket's and " + levelStream + "'s leader", node: node, at: at, election: election, moves: moves}}, 3*time.Second)
	t.Logf("%d offset updates seen", offs.Check())
}
