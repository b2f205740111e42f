package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
)

// TestDelayctlStatsReplicas: with two delayd replicas on one server,
// `delayctl stats` gathers both replicas' replies to its one request: the
// JSON lists both (two holder ids, every lease held by exactly one of
// them), each level row names the replica that owns it, and the table
// prints a line per replica and the OWNER column.
func TestDelayctlStatsReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const table = "100ms 2s"
	var svcs []*deliver.Service
	for range 2 {
		b.startDelayd(table)
		stop, err := b.svc.StartStatsAPI()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stop() })
		svcs = append(svcs, b.svc)
	}
	url := b.srv.ClientURL()
	// Every lease is held by one of the two once both bid.
	waitFor(t, 20*time.Second, "every lease held by one replica", func() bool {
		held := map[string]int{}
		for _, s := range svcs {
			for _, l := range s.Leases() {
				if l.Held {
					held[l.Key]++
				}
			}
		}
		for _, l := range svcs[0].Leases() {
			if held[l.Key] != 1 {
				return false
			}
		}
		return len(held) > 0
	})

	r := delayctl(t, url, "stats", "--json", "--levels="+table)
	r.want(t, 0)
	var s struct {
		Levels []struct {
			Stream   string `json:"stream"`
			Exists   bool   `json:"exists"`
			InTable  bool   `json:"in_table"`
			OwnerPID *int   `json:"owner_pid"`
			Holder   string `json:"owner_holder"`
		} `json:"levels"`
		Counters *deliver.StatsReply  `json:"counters"`
		Replicas []deliver.StatsReply `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.stdout)
	}
	if len(s.Replicas) != 2 {
		t.Fatalf("stats --json lists %d replicas, want 2:\n%s", len(s.Replicas), r.stdout)
	}
	holders := map[string]bool{}
	owners := map[string]int{} // lease key -> replicas holding it
	for _, rep := range s.Replicas {
		holders[rep.Holder] = true
		for _, l := range rep.Leases {
			if l.Held {
				owners[l.Key]++
				if l.Epoch == 0 {
					t.Errorf("holder %s holds %s at epoch 0", rep.Holder, l.Key)
				}
			}
		}
	}
	if len(holders) != 2 || holders[""] {
		t.Errorf("holders %v: want two distinct, non-empty", holders)
	}
	for key, n := range owners {
		if n != 1 {
			t.Errorf("%s held by %d replicas in the reply", key, n)
		}
	}
	if s.Counters == nil || !s.Counters.RouterOwner {
		t.Errorf("counters %+v: want the router owner's reply", s.Counters)
	}
	inTable := 0
	for _, l := range s.Levels {
		if l.Exists && l.InTable {
			inTable++
		}
		if l.Exists && (l.OwnerPID == nil || !holders[l.Holder] || owners["level."+l.Stream] != 1) {
			t.Errorf("level %s: owner pid %v holder %q: want the replica holding level.%s", l.Stream, l.OwnerPID, l.Holder, l.Stream)
		}
	}

	if inTable != 3 {
		t.Errorf("stats --json lists %d existing level streams of the table %q, want 3 (level 0 and its two, each with its owner):\n%s", inTable, table, r.stdout)
	}

	text := delayctl(t, url, "stats", "--levels="+table)
	text.want(t, 0, "OWNER", "2 delayd processes (replicas) answered")
	t.Logf("delayctl stats:\n%s", text.stdout)
	if n := strings.Count(text.stdout, "delayd (pid "); n != 2 {
		t.Errorf("stats prints %d replica lines, want 2:\n%s", n, text.stdout)
	}
	if n := strings.Count(text.stdout, " holds: "); n != 2 {
		t.Errorf("stats prints %d lease lines, want 2:\n%s", n, text.stdout)
	}
}
