//go:build long && unix

package cluster

import (
	"strconv"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestReplicasIngressPartitionsKill9 runs two delayd replicas (processes)
// with DELAYD_INGRESS_PARTITIONS=4 on a 3-node cluster (R3): the four
// router leases router.0 … router.3 are shared between them. During 6,000
// messages over three levels (each level 4 partition streams), the replica
// holding router.<k> is killed with SIGKILL and restarted, for k = 0, 1, 2:
// the other replica (or the restarted one) takes that router lease at a
// higher epoch (asserted), and the load's checks hold: every level's
// partition streams hold each message sent to the level once (no router
// lost or doubled a write across the takeovers), nothing lost, early or
// doubled at the stream target, nothing lost or early at the core target
// and no more duplicates there than a window per level stream per kill, no
// offset moves back.
func TestReplicasIngressPartitionsKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test with two replicas on a 3-node cluster: skipped when testing.Short()")
	}
	const parts = 4
	c := natstest.StartCluster(t, 3)
	rs := startReplicas(t, c.URLs(), 2, "DELAYD_INGRESS_PARTITIONS="+strconv.Itoa(parts))
	nc, js := c.Connect(0)
	offs := itest.WatchOffsets(t, js)
	for i := range parts {
		waitOwner(t, rs, "router."+strconv.Itoa(i), time.Minute)
	}
	cfg := loadConfig{Total: 6000, Rate: 1000, Levels: clusterLevels, IngressPartitions: parts}
	l := newLoad(t, nc, js, cfg)
	l.start()

	const kills = 3
	for k := range kills {
		l.waitAcked((k+1)*cfg.Total/(kills+1), 2*time.Minute)
		key := "router." + strconv.Itoa(k)
		o, m := waitOwner(t, rs, key, time.Minute)
		at := time.Now()
		rs[o].kill9()
		rs[o].restart()
		n, nm := waitOwner(t, rs, key, time.Minute)
		if nm.epoch[key] <= m.epoch[key] {
			t.Errorf("kill %d: %s holds %s at epoch %d after %s held it at epoch %d", k+1, rs[n].name, key, nm.epoch[key], rs[o].name, m.epoch[key])
		}
		t.Logf("kill %d at %s: %s held %v; %s holds %s at epoch %d, seen %s after the kill",
			k+1, at.Format("15:04:05.000"), rs[o].name, m.heldKeys(), rs[n].name, key, nm.epoch[key], time.Since(at).Round(time.Millisecond))
		rs[o].waitReady(time.Minute)
	}

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	t.Logf("%d kills of a router's holder, %d ingress partitions:\n%s", kills, parts, rep)
	rep.checkLevels(t)
	rep.checkStream(t)
	// A killed replica may have owned any of a level's partition streams:
	// a window per level stream (levels × partitions) per kill.
	rep.checkCore(t, kills*parts, deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.Check())
}
