package deliver_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestLeasesAndStatsAnswers runs a Service with a fixed level table, routes
// and delivers a few messages, and checks what [deliver.Service.Leases] and
// [deliver.Service.Stats] answer before Run, while it runs and once it has
// returned: every key, the shape, and the counts that follow from the run.
// It uses the public API only, so that it runs unchanged on the commit
// before issue 20's reshape (08c0bf8): the answers are the same before and
// after it (docs/reshape.md, F1).
func TestLeasesAndStatsAnswers(t *testing.T) {
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	table := levels.MustParse("200ms 1s")
	// One process, no takeover: a TTL that starvation under -race cannot
	// expire, so every term counted is the first.
	svc, err := deliver.New(nc, deliver.Config{Levels: table, LeaseTTL: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The level streams: the table's two, its precision levels (below its
	// first) and the zero level's, sorted by name as Stats sorts them; 3
	// messages go to the first level and 2 to the second, none to the
	// others.
	delivered := map[string]uint64{levels.StreamName(200 * time.Millisecond): 3, levels.StreamName(time.Second): 2}
	streams := []string{levels.StreamName(0)}
	for _, l := range append(table.PrecisionLevels(), table.Levels()...) {
		streams = append(streams, l.Stream())
	}
	slices.Sort(streams)
	keys := []string{"janitor"}
	for _, name := range streams {
		keys = append(keys, "level."+name)
	}
	keys = append(keys, "router")

	// Before Run: no leases, no levels, zero router counters.
	if got := svc.Leases(); len(got) != 0 {
		t.Fatalf("Leases before Run = %+v, want none", got)
	}
	if rs, ss := svc.Stats(); !isZeroRouter(rs) || len(ss) != 0 {
		t.Fatalf("Stats before Run = %+v, %+v, want zero and none", rs, ss)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	waitFor(t, "ready", svc.Ready)

	sub, err := nc.SubscribeSync("tgt.ls")
	if err != nil {
		t.Fatal(err)
	}
	perLevel := []uint64{3, 2} // messages at the first level, at the second
	for lvl, n := range perLevel {
		for i := range n {
			m := nats.NewMsg("delay.tgt.ls")
			m.Header.Set("Delay-Level", strconv.Itoa(lvl+1))
			m.Data = []byte(strconv.Itoa(lvl) + "." + strconv.FormatUint(i, 10))
			if _, err := nc.RequestMsg(m, 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range perLevel[0] + perLevel[1] {
		if _, err := sub.NextMsg(30 * time.Second); err != nil {
			t.Fatal("delivery:", err)
		}
	}
	// Settled: every delivery counted and its offset committed.
	waitFor(t, "deliveries counted and committed", func() bool {
		rs, ss := svc.Stats()
		if rs.Routed != 5 || len(ss) != len(streams) {
			return false
		}
		for _, s := range ss {
			if s.Delivered != delivered[s.Stream] || s.CommitLag != 0 || s.Pending != 0 {
				return false
			}
		}
		return true
	})

	// Running: every lease held, in its first term.
	leases := svc.Leases()
	if got := leaseKeys(leases); !slices.Equal(got, keys) {
		t.Fatalf("Leases keys = %q, want %q", got, keys)
	}
	epochs := map[string]uint64{}
	for _, l := range leases {
		if !l.Held || l.Epoch == 0 || l.Gained != 1 || l.Failovers != 0 {
			t.Errorf("running: lease %+v, want held, an epoch, gained 1, no failover", l)
		}
		epochs[l.Key] = l.Epoch
	}
	rs, ss := svc.Stats()
	want := deliver.RouterStats{Routed: 5, Owner: true, Epoch: epochs["router"], Lease: "router"}
	if !sameRouter(rs, want) {
		t.Errorf("running: router stats %+v, want %+v", rs, want)
	}
	for i, s := range ss {
		if s.Stream != streams[i] {
			t.Fatalf("running: level stats %d is %q, want %q (sorted by stream)", i, s.Stream, streams[i])
		}
		st, err := js.Stream(ctx, s.Stream)
		if err != nil {
			t.Fatal(err)
		}
		last := st.CachedInfo().State.LastSeq
		if s.Offset != last || s.Delivered != delivered[s.Stream] || s.DeadLettered != 0 || s.Retries != 0 ||
			s.Forwarded != 0 || s.Cancelled != 0 || s.Pending != 0 || s.CommitLag != 0 || s.OldestDueAge != 0 ||
			s.Steps == 0 || !s.Owner || s.Epoch != epochs["level."+s.Stream] || s.FencedWrites != 0 {
			t.Errorf("running: level stats %+v, want offset %d (the stream's last), delivered %d, owner in epoch %d, nothing else counted",
				s, last, delivered[s.Stream], epochs["level."+s.Stream])
		}
	}

	// Stopped: nothing held, the last terms' epochs and every count kept.
	stop()
	if err := <-done; err != nil {
		t.Fatal("Run:", err)
	}
	leases = svc.Leases()
	if got := leaseKeys(leases); !slices.Equal(got, keys) {
		t.Fatalf("stopped: Leases keys = %q, want %q", got, keys)
	}
	for _, l := range leases {
		if l.Held || l.Epoch != epochs[l.Key] || l.Gained != 1 || l.Failovers != 0 {
			t.Errorf("stopped: lease %+v, want not held, epoch %d, gained 1, no failover", l, epochs[l.Key])
		}
	}
	rs, stopped := svc.Stats()
	want.Owner = false
	if !sameRouter(rs, want) {
		t.Errorf("stopped: router stats %+v, want %+v", rs, want)
	}
	if len(stopped) != len(ss) {
		t.Fatalf("stopped: %d level stats, want %d", len(stopped), len(ss))
	}
	for i, s := range stopped {
		if s.Stream != ss[i].Stream || s.Owner || s.Epoch != ss[i].Epoch || s.Offset != ss[i].Offset ||
			s.Delivered != ss[i].Delivered || s.Pending != 0 || s.CommitLag != 0 {
			t.Errorf("stopped: level stats %+v, want %s not owned, epoch %d, offset %d, delivered %d", s, ss[i].Stream, ss[i].Epoch, ss[i].Offset, ss[i].Delivered)
		}
	}
}

func leaseKeys(ls []deliver.LeaseStats) []string {
	keys := make([]string, 0, len(ls))
	for _, l := range ls {
		keys = append(keys, l.Key)
	}
	return keys
}

func isZeroRouter(rs deliver.RouterStats) bool { return sameRouter(rs, deliver.RouterStats{}) }

// sameRouter compares router stats field by field (FencedWrites, a map,
// must be empty in both).
func sameRouter(a, b deliver.RouterStats) bool {
	return a.Routed == b.Routed && a.DeadLettered == b.DeadLettered && a.Clamped == b.Clamped && a.Skipped == b.Skipped &&
		a.Merged == b.Merged && a.IndexErrors == b.IndexErrors && a.Owner == b.Owner && a.Epoch == b.Epoch &&
		a.IngressPartition == b.IngressPartition && a.Lease == b.Lease && len(a.FencedWrites) == 0 && len(b.FencedWrites) == 0
}

// waitFor polls cond until it holds; a generous liveness bound, not a
// timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
