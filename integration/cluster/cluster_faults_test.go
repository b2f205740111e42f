//go:build long && unix

package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// Fault tests on a 3-node NATS cluster (natstest.StartCluster, R3 streams
// with DELAYD_REPLICAS=3), with delayd as separate processes
// (procs_test.go), a load with a checker (load_test.go) and a TCP proxy
// (internal/itest/proxy.go). The tests here run ONE replica; the tests with three
// replicas are in cluster_replicas_test.go (TestReplicas*), which covers
// the list below except the SIGSTOP of the router alone (today one replica
// holds the router and its levels together, and TestReplicasPauseOwner
// stops that replica) and uses a real kill -9 of nats-server processes
// (natsproc_test.go) for the node faults.
//
// Issue 12's planned tests with three replicas (startReplica "r0".."r2"
// on c.URLs(); the owner of a level is read from /metrics), each checked
// with load.report (checkStream: nothing lost, early or duplicated at the
// stream target; checkCore; and itest.WatchOffsets: offsets never move back):
//   - kill -9 of the owner of a level, at least 10 times during 50,000
//     messages: replica.kill9 + replica.restart at load.waitAcked points;
//     failover time from targetReport.LongestGap and Lateness.
//   - SIGSTOP of an owner for less than T, more than T, and more than the
//     server's ping timeout, then SIGCONT: replica.pause, let time pass,
//     replica.resume; the stale owner's fence from its log
//     (replica.waitLog) and itest.OffsetWatch.
//   - SIGSTOP of the active router while the load publishes: replica.pause
//     on the router lease's holder; level streams' ingress references
//     strictly increasing.
//   - kill of a NATS node, in turn the leader of a level stream
//     (Cluster.StreamLeader("DELAYD_1S")), of the lease bucket
//     (Cluster.BucketLeader("DELAYD_LEASES")), and the node the owner is
//     connected to (Cluster.NodeOf(replica.connectedURL())):
//     Cluster.Stop + Cluster.Restart, as TestClusterNodeStops here.
//   - a cut network between one replica and the cluster, then healed:
//     that replica on itest.StartProxy per node of a NoAdvertise cluster,
//     Proxy.CutOff / Proxy.Stall + Proxy.Heal, as TestClusterCutOff here.
//   - a rolling restart of every replica, and scaling 1 -> 3 -> 1 under
//     load: replica.term (exit 0 expected) + replica.restart / startReplica,
//     with no failover wait (LongestGap) on a graceful handover.

// clusterLevels is the level table of these tests ([replicaLevelsDefault]).
var clusterLevels = levels.MustParse(replicaLevelsDefault)

// clusterLoad is the load of these tests: 5,000 messages over the three
// levels, offered at 1,000 per second, so that faults land mid-load.
var clusterLoad = loadConfig{Total: 5000, Rate: 1000, Levels: clusterLevels}

// TestClusterKill9 runs one delayd replica on a 3-node cluster (R3) and
// kills it with SIGKILL three times during the load, restarting it each
// time, then stops it (SIGSTOP) for 2 s and continues it: nothing is lost
// or early at either target, the stream target holds no duplicate, the core
// target no more than a window per level per fault, no level's offset
// moves back, and the last replica stops gracefully (exit status 0).
func TestClusterKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3)
	r := startReplica(t, "r0", c.URLs())
	r.waitReady(time.Minute)
	nc, js := c.Connect(0)
	offs := itest.WatchOffsets(t, js)
	l := newLoad(t, nc, js, clusterLoad)
	l.start()
	const kills = 3
	for k := 1; k <= kills; k++ {
		l.waitAcked(k*clusterLoad.Total/(kills+1), time.Minute)
		r.kill9()
		r.restart()
		r.waitReady(time.Minute)
	}
	// A pause: a stopped process answers nothing, not even /readyz; once
	// continued it answers again.
	l.waitAcked(clusterLoad.Total*7/8, time.Minute)
	r.pause()
	if code, _, err := r.get("/readyz"); err == nil {
		t.Errorf("/readyz answered %d while the replica was stopped", code)
	}
	time.Sleep(time.Second) // let time pass: the pause lasts 2 s in all, with the request's 1 s timeout
	r.resume()
	r.waitReady(time.Minute)
	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	t.Logf("%d kills and a 2 s pause:\n%s", kills, rep)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, kills+1, deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.Check())
	if err := r.term(30 * time.Second); err != nil {
		t.Error(err)
	}
}

// TestClusterNodeStops stops the NATS node the replica is connected to
// mid-load and restarts it once deliveries have resumed: the replica
// reconnects to another node, and nothing is lost or early at either
// target, with no duplicate at the stream target. The stall (the longest
// pause between deliveries, what the cluster's elections and the
// reconnect take) is logged, not asserted. (Cluster.Stop is an embedded
// server's shutdown, not a process's kill -9.)
func TestClusterNodeStops(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3)
	r := startReplica(t, "r0", c.URLs())
	r.waitReady(time.Minute)
	node := c.NodeOf(r.waitConnected(time.Minute))
	if node < 0 {
		t.Fatalf("replica connected to %q, not a node of the cluster %s", r.connectedURL(), c.URLs())
	}
	nc, js := c.Connect((node + 1) % 3) // the test's client stays up
	offs := itest.WatchOffsets(t, js)
	l := newLoad(t, nc, js, clusterLoad)
	l.start()

	l.waitAcked(clusterLoad.Total/3, time.Minute)
	leaders := map[string]int{}
	for _, s := range []string{deliver.IngressStream, "KV_" + offsets.Bucket, loadStream, levels.StreamName(time.Second)} {
		leaders[s] = c.StreamLeader(s)
	}
	before := len(l.core.Snapshot())
	stopped := time.Now()
	c.Stop(node)
	t.Logf("stopped node %d, the replica's, at %s; stream leaders then (node index): %v", node, stopped.Format("15:04:05.000"), leaders)
	ev := r.waitLog("reconnected to NATS", stopped, time.Minute)
	if to := c.NodeOf(ev.attr("url")); to == node || to < 0 {
		t.Fatalf("replica reconnected to %q (node %d) after node %d stopped", ev.attr("url"), to, node)
	}
	t.Logf("replica reconnected to %s %s after the stop", ev.attr("url"), ev.logged.Sub(stopped).Round(time.Millisecond))
	itest.WaitFor(t, time.Minute, "core deliveries to resume", func() bool { return len(l.core.Snapshot()) > before+100 })
	c.Restart(node)
	t.Logf("restarted node %d %s after the stop", node, time.Since(stopped).Round(time.Millisecond))

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	t.Logf("node %d stopped and restarted:\n%s", node, rep)
	t.Logf("stall: the longest pause between deliveries was %s at the stream target (from %s) and %s at the core target (from %s); the node stopped at %s",
		rep.Stream.LongestGap.Round(time.Millisecond), rep.Stream.GapFrom.Format("15:04:05.000"),
		rep.Core.LongestGap.Round(time.Millisecond), rep.Core.GapFrom.Format("15:04:05.000"), stopped.Format("15:04:05.000"))
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, 1, deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.Check())
}

// TestClusterCutOff connects the replica to the cluster only through a
// proxy per node (the nodes advertise no other URL) and cuts all three for
// 3 s mid-load, then heals them: the replica logs a disconnect, reconnects
// only after the heal (it found no way around the cut), and nothing is
// lost or early at either target, with no duplicate at the stream target.
func TestClusterCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3, natstest.NoAdvertise)
	var proxies []*itest.Proxy
	var urls []string
	for i := range c.Len() {
		p := itest.StartProxy(t, strings.TrimPrefix(c.URL(i), "nats://"))
		proxies = append(proxies, p)
		urls = append(urls, p.URL())
	}
	r := startReplica(t, "r0", strings.Join(urls, ","))
	r.waitReady(time.Minute)
	nc, js := c.Connect(0)
	offs := itest.WatchOffsets(t, js)
	l := newLoad(t, nc, js, clusterLoad)
	l.start()

	l.waitAcked(clusterLoad.Total/3, time.Minute)
	cut := time.Now()
	for _, p := range proxies {
		p.CutOff()
	}
	r.waitLog("disconnected from NATS", cut, 30*time.Second)
	time.Sleep(3 * time.Second) // let time pass: the cut lasts 3 s
	healed := time.Now()
	for _, p := range proxies {
		p.Heal()
	}
	ev := r.waitLog("reconnected to NATS", cut, time.Minute)
	if ev.logged.Before(healed) {
		t.Errorf("replica reconnected to %s at %s, during the cut (%s to %s)", ev.attr("url"), ev.logged.Format("15:04:05.000"),
			cut.Format("15:04:05.000"), healed.Format("15:04:05.000"))
	}
	t.Logf("cut at %s, healed at %s, replica reconnected %s after the heal", cut.Format("15:04:05.000"),
		healed.Format("15:04:05.000"), ev.logged.Sub(healed).Round(time.Millisecond))

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	t.Logf("cut for 3s:\n%s", rep)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, 1, deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.Check())
}
