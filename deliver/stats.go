package deliver

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/delayd/delayd/deliver/internal/ownership"
)

// leaseState is one lease's state in this Service, for [Service.Leases].
type leaseState struct {
	elector           *ownership.Elector
	gained, failovers atomic.Uint64
}

// LeaseStats is this Service's view of one lease.
type LeaseStats struct {
	// Key is the lease key: "router", or "level." + a level stream's name.
	Key string
	// Held reports whether this Service holds the lease now.
	Held bool
	// Epoch is the epoch of this Service's last term of the lease; 0 if it
	// never held it.
	Epoch uint64
	// Gained counts the terms this Service gained since start.
	Gained uint64
	// Failovers counts this Service's terms that ended without its
	// resigning: expired (no renewal stored in time), lost to another
	// holder, or given up when the work stopped (fenced). Each one hands
	// the work to another replica after the TTL, not at once.
	Failovers uint64
}

// Leases returns this Service's view of every lease it bids for, sorted by
// key; empty until Run has set up.
func (s *Service) Leases() []LeaseStats {
	s.mu.Lock()
	leases := s.own.leases
	s.mu.Unlock()
	out := make([]LeaseStats, 0, len(leases))
	for key, st := range leases {
		epoch, held := st.elector.Held()
		out = append(out, LeaseStats{Key: key, Held: held, Epoch: epoch, Gained: st.gained.Load(), Failovers: st.failovers.Load()})
	}
	slices.SortFunc(out, func(a, b LeaseStats) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Balance returns how many replicas are live (this one included, as
// counted from their membership keys in DELAYD_LEASES), this replica's
// share of the leases (ceil(leases / live)) and how many it holds; zeros
// until Run has set up.
func (s *Service) Balance() (live, share, held int) {
	if b := s.own.balancer.Load(); b != nil {
		return b.Share()
	}
	return 0, 0, 0
}

// event counts an elector's event (every elector's [ownership.Event],
// through the ownership Service's OnEvent); it runs on the elector's
// goroutine. It writes only the leases' atomic counters and the gain
// log, which the Service reads.
func (l *serviceLeases) event(ev ownership.Event) {
	if st := l.leases[ev.Key]; st != nil {
		switch ev.Kind {
		case ownership.Gained:
			st.gained.Add(1)
			l.gains.gained(ev)
		case ownership.Lost:
			st.failovers.Add(1)
		}
	}
	if l.onLease != nil {
		l.onLease(ev)
	}
}

// Stats returns the router's counters and each scanner's, by stream name.
// With ingress partitions the router's are the sum over this replica's
// routers (Owner if it routes any partition, Epoch the highest, no
// IngressPartition or Lease); [Service.RouterStats] gives each one's.
func (s *Service) Stats() (RouterStats, []ScannerStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs RouterStats
	switch len(s.parts.routers) {
	case 0:
	case 1:
		rs = RouterStats(s.parts.routers[0].Stats())
	default:
		for _, r := range s.parts.routers {
			st := r.Stats()
			rs.Routed += st.Routed
			rs.DeadLettered += st.DeadLettered
			rs.Clamped += st.Clamped
			rs.Skipped += st.Skipped
			rs.Merged += st.Merged
			rs.IndexErrors += st.IndexErrors
			rs.Owner = rs.Owner || st.Owner
			rs.Epoch = max(rs.Epoch, st.Epoch)
			for stream, n := range st.FencedWrites {
				if rs.FencedWrites == nil {
					rs.FencedWrites = make(map[string]uint64)
				}
				rs.FencedWrites[stream] += n
			}
		}
	}
	var ss []ScannerStats
	for _, l := range s.parts.levels {
		ss = append(ss, ScannerStats(l.Stats()))
	}
	slices.SortFunc(ss, func(a, b ScannerStats) int { return strings.Compare(a.Stream, b.Stream) })
	return rs, ss
}

// RouterStats returns each router's counters in this replica, by ingress
// partition: one entry when ingress is not partitioned; nil until Run has
// set up.
func (s *Service) RouterStats() []RouterStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RouterStats, 0, len(s.parts.routers))
	for _, r := range s.parts.routers {
		out = append(out, RouterStats(r.Stats()))
	}
	return out
}
