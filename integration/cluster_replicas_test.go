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

// TestReplicasPauseOwner stops the owner of a level with SIGSTOP and
// continues it, three times during the load on one cluster whose nodes
// ping their clients every 2 s and close a connection after two
// unanswered pings: for less than the lease TTL T (T/3), for longer than T
// until another replica has taken the level over (its epoch above the
// stopped owner's: asserted), and for 10 s, longer than the server's ping
// timeout (the continued process must find its connection closed:
// asserted from its log). After each long pause, the stale owner stops
// holding the level's lease once continued (asserted), and from then on
// its delayd_delivered_total for the level, once settled (deliveries
// published before the stop may be confirmed after it), does not move
// unless it takes the lease again (asserted at the end); the offsets never move back (a
// stale owner's commit after the new owner's bump would fail its
// compare-and-set, or show as an offset moving back); and the load's
// checks hold.
func TestReplicasPauseOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test with three replicas on a 3-node cluster: skipped when testing.Short()")
	}
	const ttl = 1500 * time.Millisecond // DELAYD_LEASE_TTL's default
	c := natstest.StartCluster(t, 3, natstest.PingInterval(2*time.Second, 2))
	rs := startReplicas(t, c.URLs(), 3, "DELAYD_LEASE_TTL="+ttl.String())
	nc, js := c.Connect(0)
	offs := watchOffsets(t, js)
	cfg := loadConfig{Total: 20000, Rate: 1000, Levels: clusterLevels}
	l := newLoad(t, nc, js, cfg)
	l.start()

	type stale struct {
		r         int
		key       string
		stream    string
		epoch     uint64 // the stale term's
		delivered uint64 // the level's delayd_delivered_total once it no longer held it
	}
	var stales []stale
	var marks []faultMark
	lv := clusterLevels.Levels()
	steps := []struct {
		name     string
		pause    time.Duration // at least; a takeover pause lasts until the takeover
		takeover bool          // wait, while stopped, for another replica to take the level
		pingOut  bool          // the server closes the stopped process's connection
	}{
		{name: "shorter than T", pause: ttl / 3},
		{name: "longer than T", pause: ttl, takeover: true},
		{name: "longer than the ping timeout", pause: 10 * time.Second, takeover: true, pingOut: true},
	}
	for k, step := range steps {
		l.waitAcked((k+1)*cfg.Total/(len(steps)+1), 2*time.Minute)
		stream := lv[k%len(lv)].Stream()
		key := levelKey(stream)
		o, m := waitOwner(t, rs, key, time.Minute)
		stopped := time.Now()
		rs[o].pause()
		took := ""
		if step.takeover {
			n, nm := waitOwner(t, rs, key, time.Minute, o)
			if nm.epoch[key] <= m.epoch[key] {
				t.Errorf("pause %s: %s holds %s at epoch %d, the stopped %s held it at epoch %d", step.name, rs[n].name, key, nm.epoch[key], rs[o].name, m.epoch[key])
			}
			took = fmt.Sprintf("; %s took %s over at epoch %d %s after the stop", rs[n].name, key, nm.epoch[key], time.Since(stopped).Round(time.Millisecond))
		}
		time.Sleep(time.Until(stopped.Add(step.pause))) // let time pass: the pause's length is the fault
		resumed := time.Now()
		rs[o].resume()
		marks = append(marks, faultMark{name: fmt.Sprintf("pause %s (%s)", step.name, rs[o].name), at: stopped, levels: m.heldLevels(clusterLevels)})
		t.Logf("pause %s: %s, holding %v (epoch %d of %s), stopped for %s%s", step.name, rs[o].name, m.heldKeys(), m.epoch[key], key,
			resumed.Sub(stopped).Round(time.Millisecond), took)
		if step.pingOut {
			ev := rs[o].waitLog("disconnected from NATS", stopped, time.Minute)
			t.Logf("pause %s: %s logged %q (%s) %s after SIGCONT", step.name, rs[o].name, ev.msg, ev.attr("error"), ev.logged.Sub(resumed).Round(time.Millisecond))
		}
		if !step.takeover {
			// Whether the lease survived a pause of T/3 depends on when
			// its last renewal was sent: logged, not asserted.
			_, ms := holders(rs, key)
			t.Logf("pause %s: after SIGCONT %s holds %s: %v at epoch %d (was %d)", step.name, rs[o].name, key, ms[o].held[key], ms[o].epoch[key], m.epoch[key])
			rs[o].waitReady(time.Minute)
			continue
		}
		var sm replicaMetrics
		waitFor(t, time.Minute, rs[o].name+" to stop holding "+key+" once continued", func() bool {
			var err error
			sm, err = rs[o].scrape()
			return err == nil && !sm.held[key]
		})
		// Deliveries it published before the stop may be confirmed after
		// SIGCONT: its count settles, then must not move.
		waitQuiet(t, 2*time.Second, time.Minute, func() int {
			if m, err := rs[o].scrape(); err == nil {
				sm = m
			}
			return int(sm.delivered[stream])
		})
		t.Logf("pause %s: %s holds %v once continued; delivered on %s %d before the stop, %d now; fenced writes %v; failovers %v", step.name, rs[o].name,
			sm.heldKeys(), stream, m.delivered[stream], sm.delivered[stream], sm.fenced, sm.failovers)
		for _, msg := range []string{"lease expired", "lease lost: another holder wrote it", "level stopped: this replica's lease term ended",
			"offset commit fenced: another owner wrote the offset; committing nothing more", "router stopped: this replica's lease term ended"} {
			for _, e := range rs[o].log.events() {
				if e.msg == msg && !e.logged.Before(stopped) {
					t.Logf("pause %s: %s logged %q (%v) %s after SIGCONT", step.name, rs[o].name, msg, e.fields["lease"], e.logged.Sub(resumed).Round(time.Millisecond))
					break
				}
			}
		}
		stales = append(stales, stale{r: o, key: key, stream: stream, epoch: m.epoch[key], delivered: sm.delivered[stream]})
		rs[o].waitReady(time.Minute)
	}

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	for _, s := range stales {
		m, err := rs[s.r].scrape()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m.epoch[s.key] != s.epoch:
			t.Logf("%s took %s again later (epoch %d): its deliveries are not checked", rs[s.r].name, s.key, m.epoch[s.key])
		case m.delivered[s.stream] != s.delivered:
			t.Errorf("%s delivered %d on %s after its term (epoch %d) ended", rs[s.r].name, m.delivered[s.stream]-s.delivered, s.stream, s.epoch)
		}
	}
	rep := l.report()
	t.Logf("%d pauses of a level's owner:\n%s", len(steps), rep)
	logFailovers(t, l, marks, 12*time.Second)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, len(steps), deliver.ScannerWindowDefault, clusterLevels)
	t.Logf("%d offset updates seen", offs.check())
}
