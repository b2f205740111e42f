//go:build long

package cluster

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestDelayctlStatsDeadOwner: right after the replica that owns a level is
// killed with SIGKILL, and before its lease can be taken (another replica
// takes it only once it has seen it unchanged for DELAYD_LEASE_TTL, here
// 10 s), `delayctl stats` shows that level's counters as unknown (null,
// "?") and no owner, not as 0; the surviving replica's levels keep their
// owner.
func TestDelayctlStatsDeadOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs delayd processes: skipped under testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	env := []string{"DELAYD_REPLICAS=1", "DELAYD_LEASE_TTL=10s"}
	rs := []*replica{startReplica(t, "r0", srv.ClientURL(), env...)}
	rs[0].waitReady(time.Minute)
	rs = append(rs, startReplica(t, "r1", srv.ClientURL(), env...))
	rs[1].waitReady(time.Minute)
	// Each holds some level once the leases are balanced: the same
	// owners in two scrapes a second apart, each lease held by one.
	var dead, alive []string // level streams of r0 and of r1
	owners := func() ([]string, []string, bool) {
		_, ms := holders(rs, "")
		if len(ms) != 2 {
			return nil, nil, false
		}
		var of [2][]string
		for i := range 2 {
			for key, held := range ms[i].held {
				if stream, ok := strings.CutPrefix(key, "level."); ok && held {
					if ms[1-i].held[key] {
						return nil, nil, false // mid hand-over
					}
					of[i] = append(of[i], stream)
				}
			}
			slices.Sort(of[i])
		}
		return of[0], of[1], len(of[0]) > 0 && len(of[1]) > 0
	}
	itest.WaitFor(t, time.Minute, "the level leases balanced over both replicas", func() bool {
		d, a, ok := owners()
		if !ok {
			return false
		}
		time.Sleep(time.Second)
		dead, alive, ok = owners()
		return ok && slices.Equal(d, dead) && slices.Equal(a, alive)
	})
	rs[0].kill9()
	r := itest.Delayctl(t, srv.ClientURL(), "stats", "--json", "--levels="+replicaLevelsDefault)
	r.Want(t, 0)
	var s struct {
		Levels []struct {
			Stream    string  `json:"stream"`
			Delivered *uint64 `json:"delivered"`
			OwnerPID  *int    `json:"owner_pid"`
			NoOwner   bool    `json:"no_owner"`
		} `json:"levels"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.Stdout)
	}
	rows := map[string]int{}
	for i, l := range s.Levels {
		rows[l.Stream] = i
	}
	for _, stream := range dead {
		i, ok := rows[stream]
		if !ok {
			t.Errorf("%s (the killed replica's) not listed", stream)
			continue
		}
		if l := s.Levels[i]; l.Delivered != nil || l.OwnerPID != nil || !l.NoOwner {
			t.Errorf("%s, its owner killed: delivered %v owner %v no_owner %v; want unknown, none, true", stream, l.Delivered, l.OwnerPID, l.NoOwner)
		}
	}
	for _, stream := range alive {
		i, ok := rows[stream]
		if !ok {
			t.Errorf("%s (the surviving replica's) not listed", stream)
			continue
		}
		if l := s.Levels[i]; l.Delivered == nil || l.OwnerPID == nil || *l.OwnerPID != rs[1].PID() || l.NoOwner {
			t.Errorf("%s: delivered %v owner %v no_owner %v; want r1's (pid %d) counters", stream, l.Delivered, l.OwnerPID, l.NoOwner, rs[1].PID())
		}
	}
	text := itest.Delayctl(t, srv.ClientURL(), "stats", "--levels="+replicaLevelsDefault)
	text.Want(t, 0, "OWNER", "none answering")
	t.Logf("killed r0 owned %v, r1 owns %v; delayctl stats:\n%s", dead, alive, text.Stdout)
}
