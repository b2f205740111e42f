//go:build unix

package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/natstest"
)

// TestReplicaTableMismatch runs delayd as processes: a second replica
// whose DELAYD_LEVELS differs from the running one's exits at once with
// status 2 (bad configuration), its log naming DELAYD_LEVELS, while the
// first keeps running; after the first stops gracefully, the same
// command starts (the new table is accepted).
func TestReplicaTableMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs delayd processes: skipped under testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	a := startReplica(t, "a", srv.ClientURL(), "DELAYD_REPLICAS=1")
	a.waitReady(time.Minute)
	b := startReplica(t, "b", srv.ClientURL(), "DELAYD_REPLICAS=1", "DELAYD_LEVELS=200ms 1s 3s")
	st := b.wait(time.Minute)
	if st.ExitCode() != 2 {
		t.Errorf("b, another level table while a runs: %s, want exit status 2", st)
	}
	ev := b.waitLog("delayd cannot start: a live replica's configuration differs", time.Time{}, time.Second)
	if e := ev.attr("error"); !strings.Contains(e, `DELAYD_LEVELS="200ms 1s 3s"`) || !strings.Contains(e, `"200ms 1s 2s"`) {
		t.Errorf("b's error %q does not name DELAYD_LEVELS and both tables", e)
	}
	if !a.running() {
		t.Fatal("a stopped")
	}
	if err := a.term(time.Minute); err != nil {
		t.Fatal(err)
	}
	b.restart()
	b.waitReady(time.Minute)
}

// TestReplicasOnSingleServer: DELAYD_REPLICAS=3 against a server that is
// not clustered exits at once with status 2 (bad configuration), its
// error naming DELAYD_REPLICAS and its value, instead of retrying its
// setup for ever without becoming ready.
func TestReplicasOnSingleServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a delayd process: skipped under testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	r := startReplica(t, "r", srv.ClientURL(), "DELAYD_REPLICAS=3")
	st := r.wait(time.Minute)
	if st.ExitCode() != 2 {
		t.Errorf("DELAYD_REPLICAS=3 on a single server: %s, want exit status 2", st)
	}
	ev := r.waitLog("delayd cannot start: the server cannot hold replicated streams", time.Time{}, time.Second)
	if e := ev.attr("error"); !strings.Contains(e, `DELAYD_REPLICAS="3"`) || !strings.Contains(e, "not clustered") {
		t.Errorf("error %q does not name DELAYD_REPLICAS, its value and the cause", e)
	}
}
