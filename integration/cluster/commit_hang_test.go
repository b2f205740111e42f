//go:build long && unix

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/offsets"
)

// commitTimeout bounds each commit of TestCommitLeaderHang. The scanner's
// is 10 s, but a JetStream election after a leader hangs takes a random
// 4–9 s election timeout after the missed heartbeats, and over 10 s on a
// loaded machine (seen in CI under -race): a commit bounded by 10 s then
// fails for the election's length, not for waiting on the hung leader. The
// test's property is the latter, so its bound outlasts any election it
// waits for.
const commitTimeout = 30 * time.Second

// commitHang is how long TestCommitLeaderHang keeps the bucket's leader
// stopped: past the commit's whole bound, so that a commit that waits for
// the hung leader cannot pass for one re-sent to the new leader.
const commitHang = commitTimeout + 10*time.Second

// TestCommitLeaderHang: the leader of an R3 offsets bucket hangs (SIGSTOP,
// its sockets open); a fenced offset commit made at that moment (as the
// scanner's, but bounded by [commitTimeout]) completes within the bucket's
// election, measured in the same run, plus a few seconds, because its
// copies are given up after 2 s each and sent again
// (docs/design.md#re-sent-writes-to-a-hung-leader).
// When the node resumes, the copies it held are applied or refused then:
// the key keeps the commit's value (nothing moved back), the committer is
// not fenced, its next commit succeeds, and the bucket's stream holds
// exactly one message per commit (no copy was stored twice). Seen to fail on
// the code before the re-sent copies: the commit's one write waited its
// whole bound (then 10 s) and failed (context deadline exceeded).
func TestCommitLeaderHang(t *testing.T) {
	c := startProcCluster(t, 3)
	nc, js := c.Connect(0) // node 0 is never stopped
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	store, err := offsets.New(ctx, js, offsets.Config{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	const stream = "KV_" + offsets.Bucket
	// Its leader on another node than the client's.
	deadline := time.Now().Add(time.Minute)
	for c.StreamLeader(js, stream) < 1 {
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(`{"placement":{"preferred":"N1"}}`), 5*time.Second) // a failed request is tried again
		if time.Now().After(deadline) {
			t.Fatalf("%s not led by node 1 or 2 after a minute", stream)
		}
		time.Sleep(500 * time.Millisecond) // pacing: an election takes a moment
	}
	leader := c.StreamLeader(js, stream)
	c.WaitCurrent(js, time.Minute)

	cm, err := offsets.NewCommitter(store, offsets.CommitterConfig{Stream: "DELAYD_5S", Timeout: commitTimeout, Fenced: true})
	if err != nil {
		t.Fatal(err)
	}
	cm.ResetAt(0, 0) // never written: the first commit creates the key
	commit := func(seq uint64) (time.Duration, error) {
		start := time.Now()
		if err := cm.Commit(ctx, seq); err != nil {
			return 0, err
		}
		sctx, cancel := context.WithTimeout(ctx, commitTimeout+20*time.Second)
		defer cancel()
		err := cm.Await(sctx)
		return time.Since(start), err
	}
	if _, err := commit(10); err != nil {
		t.Fatalf("commit before the hang: %v", err)
	}

	proc := c.cmds[leader].Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	t.Logf("N%d (the bucket's leader): SIGSTOP", leader)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := proc.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			t.Logf("N%d: SIGCONT after %s", leader, time.Since(at).Round(time.Millisecond))
		}
	}
	defer resume()
	elected := watchElection(nc, stream, leader, at)

	took, err := commit(12)
	election := <-elected
	t.Logf("FIGURES commit during the hang: %s; the bucket's election %s; load: %s", took.Round(time.Millisecond), election.Round(time.Millisecond), loadAverage())
	if err != nil {
		t.Fatalf("commit while the bucket's leader hangs: %v after %s (election %s)", err, took.Round(time.Millisecond), election.Round(time.Millisecond))
	}
	if bound := election + 4*time.Second; took > bound {
		t.Errorf("commit took %s; want at most the election %s plus 4 s", took.Round(time.Millisecond), election.Round(time.Millisecond))
	}

	time.Sleep(time.Until(at.Add(commitHang)))
	resume()
	c.WaitCurrent(js, 2*time.Minute)
	if cm.Fenced() {
		t.Fatal("committer fenced after the node resumed: it took its own applied copy for another owner's write")
	}
	if off, err := store.Load(ctx, "DELAYD_5S"); err != nil || off != 12 {
		t.Fatalf("offset after the node resumed = %d, %v; want 12 (the held copies must not move it)", off, err)
	}
	if _, err := commit(14); err != nil {
		t.Fatalf("commit after the node resumed: %v", err)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if last := s.CachedInfo().State.LastSeq; last != 3 {
		t.Fatalf("%s last sequence %d; want 3, one per commit (10, 12, 14): a copy was stored twice", stream, last)
	}
}

// watchElection polls the leader of stream (STREAM.INFO, which only its
// leader answers) every 100 ms until one other than node answers, and
// sends the time from at; after 2 minutes it sends that.
func watchElection(nc *nats.Conn, stream string, node int, at time.Time) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		for time.Since(at) < 2*time.Minute {
			m, err := nc.Request("$JS.API.STREAM.INFO."+stream, nil, time.Second)
			if err == nil && strings.Contains(string(m.Data), `"leader":"N`) && !strings.Contains(string(m.Data), fmt.Sprintf(`"leader":"N%d"`, node)) {
				out <- time.Since(at)
				return
			}
			if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
		}
		out <- time.Since(at)
	}()
	return out
}

// loadAverage is the machine's load average as /proc/loadavg gives it;
// "unknown" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
