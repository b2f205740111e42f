//go:build unix

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
)

// Fault tests with three delayd replicas (r0..r2, processes) on a 3-node
// cluster (R3), issue 12 "Tests". Each runs a load (load_test.go) and
// checks its report: nothing lost, early or duplicated at the stream
// target (checkStream), nothing lost or early at the core target and no
// more duplicates there than one scanner window per level per fault
// (checkCore), every level stream written exactly once per message
// (checkLevels), and no offset moving back (watchOffsets). Which replica
// owns what is read from each replica's /metrics (delayd_lease_held).
// Failover figures (each touched level's longest delivery gap, its
// lateness during the failover against its normal lateness) are logged,
// never asserted.

// TestReplicasKill9Owner kills the replica that owns a level with SIGKILL
// ten times during 50,000 messages over three levels, in turn the owner of
// each level, restarting it at once as a supervisor would: another replica
// takes the level's lease over (asserted), and the load's checks hold.
// The takeover time seen through /metrics and the failover figures are
// logged.
func TestReplicasKill9Owner(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test with three replicas on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3)
	rs := startReplicas(t, c.URLs(), 3)
	nc, js := c.Connect(0)
	offs := watchOffsets(t, js)
	cfg := loadConfig{Total: 50000, Rate: 1000, Levels: clusterLevels}
	l := newLoad(t, nc, js, cfg)
	l.start()

	const kills = 10
	lv := clusterLevels.Levels()
	var marks []faultMark
	var takeovers []time.Duration
	for k := range kills {
		l.waitAcked((k+1)*cfg.Total/(kills+1), 2*time.Minute)
		key := levelKey(lv[k%len(lv)].Stream())
		o, m := waitOwner(t, rs, key, time.Minute)
		at := time.Now()
		rs[o].kill9()
		rs[o].restart()
		n, nm := waitOwner(t, rs, key, time.Minute)
		seen := time.Since(at)
		if nm.epoch[key] <= m.epoch[key] {
			t.Errorf("kill %d: %s holds %s at epoch %d after %s held it at epoch %d", k+1, rs[n].name, key, nm.epoch[key], rs[o].name, m.epoch[key])
		}
		takeovers = append(takeovers, seen)
		marks = append(marks, faultMark{name: fmt.Sprintf("kill %d (%s)", k+1, rs[o].name), at: at, levels: m.heldLevels(clusterLevels)})
		t.Logf("kill %d at %s: %s held %v (epoch %d of %s); %s holds %s at epoch %d, seen %s after the kill",
			k+1, at.Format("15:04:05.000"), rs[o].name, m.heldKeys(), m.epoch[key], key, rs[n].name, key, nm.epoch[key], seen.Round(time.Millisecond))
		rs[o].waitReady(time.Minute)
	}

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	t.Logf("%d kills of a level's owner:\n%s", kills, rep)
	t.Logf("takeovers seen through /metrics after each kill: %v", roundAll(takeovers))
	logFailovers(t, l, marks, 5*time.Second)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, kills, deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.check())
}

// roundAll rounds each duration to the millisecond, for the log.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
