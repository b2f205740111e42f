package deliver

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
)

// StatsReply is the stats API's reply: this delayd process's counters since
// it started. Counters are per process; they start at 0 on every start.
type StatsReply struct {
	// Started is when the process started serving the API, RFC 3339 UTC.
	Started time.Time `json:"started"`
	// PID is the process id, to tell delayd processes apart.
	PID int `json:"pid"`
	// Holder is the process's lease holder id (the holder named in
	// DELAYD_LEASES values); "" until the service runs.
	Holder string `json:"holder"`
	// Ready is [Service.Ready].
	Ready bool `json:"ready"`
	// Routed, Clamped and DeadLettered are the router's [RouterStats].
	Routed       uint64 `json:"routed"`
	Clamped      uint64 `json:"clamped"`
	DeadLettered uint64 `json:"dead_lettered"`
	// RouterOwner reports whether this process holds the router lease now,
	// and RouterEpoch its last term's epoch (0 if never).
	RouterOwner bool   `json:"router_owner"`
	RouterEpoch uint64 `json:"router_epoch"`
	// Routers holds one entry per ingress partition's router when ingress
	// is partitioned (DELAYD_INGRESS_PARTITIONS above 1), by partition;
	// Routed, Clamped, DeadLettered, RouterOwner and RouterEpoch above are
	// then their sums, any owner and the highest epoch. Absent otherwise.
	Routers []RouterReply `json:"routers,omitempty"`
	// DeadLetters counts every dead letter written since start by reason
	// ([Reasons]), the router's and the scanners' together.
	DeadLetters map[string]uint64 `json:"dead_letters"`
	// Levels holds one entry per level stream this process scans, by stream
	// name; empty until the service runs.
	Levels []LevelStats `json:"levels"`
	// Leases holds this process's view of every lease it bids for, by
	// key ([Service.Leases]); empty until the service runs.
	Leases []LeaseReply `json:"leases"`
}

// LeaseReply is one lease in a [StatsReply] ([LeaseStats]).
type LeaseReply struct {
	// Key is "router" (or "router.<ingress partition>"), "janitor", or
	// "level." + a level stream's name.
	Key string `json:"key"`
	// Held reports whether this process holds the lease now.
	Held bool `json:"held"`
	// Epoch is the epoch of this process's last term of the lease; 0 if
	// it never held it.
	Epoch uint64 `json:"epoch"`
	// Gained counts the terms this process gained since start; Failovers
	// those that ended without its resigning.
	Gained    uint64 `json:"gained"`
	Failovers uint64 `json:"failovers"`
}

// RouterReply is one ingress partition's router in a [StatsReply]
// ([RouterStats]).
type RouterReply struct {
	// IngressPartition is the partition it routes, 0 to N-1; Lease its
	// lease key, "router.<IngressPartition>".
	IngressPartition int    `json:"ingress_partition"`
	Lease            string `json:"lease"`
	// Owner reports whether this process holds its lease and routes now;
	// Epoch is its last term's epoch (0 if never).
	Owner bool   `json:"owner"`
	Epoch uint64 `json:"epoch"`
	// Routed, Clamped and DeadLettered count since this process's start.
	Routed       uint64 `json:"routed"`
	Clamped      uint64 `json:"clamped"`
	DeadLettered uint64 `json:"dead_lettered"`
}

// LevelStats is one scanner's counters in a [StatsReply] ([ScannerStats]).
type LevelStats struct {
	Stream       string `json:"stream"`
	Offset       uint64 `json:"offset"`
	Delivered    uint64 `json:"delivered"`
	DeadLettered uint64 `json:"dead_lettered"`
	Retries      uint64 `json:"retries"`
	Forwarded    uint64 `json:"forwarded"`
	Pending      uint64 `json:"pending"`
	// Cancelled counts the level's cancelled messages past the committed
	// offset: still in the level stream (tombstoned, not yet passed), so
	// within Pending, never to be delivered. CancelledSeqs lists the
	// lowest [StatsCancelledSeqsMax] of their sequences, ascending, so
	// that a reader of the level stream can skip them (delayctl stats
	// does); all of them when Cancelled is at most that. Both are the
	// owner's (Owner true); 0 and none on another process.
	Cancelled           uint64   `json:"cancelled"`
	CancelledSeqs       []uint64 `json:"cancelled_seqs,omitempty"`
	OldestDueAgeSeconds float64  `json:"oldest_due_age_seconds"`
	// Owner reports whether this process holds the level's lease and scans
	// it now; Epoch is its last term's epoch (0 if never).
	Owner bool   `json:"owner"`
	Epoch uint64 `json:"epoch"`
}

// StartStatsAPI subscribes to [contract.StatsSubject] on the service's connection and
// answers every request with the service's [StatsReply]. A reply costs
// O(levels) and reads atomic counters only. It may be called before Run (the
// reply then has no levels). stop unsubscribes.
//
// With several delayd processes (replicas) on one account, each answers:
// a requester that wants them all (delayctl stats) gathers the replies to
// one request until a quiet moment passes; a plain request gets the first
// answer, that is one process's counters. A level's numbers are its
// owner's (Owner true); the other processes show what they did before
// they lost it, since their start.
func (s *Service) StartStatsAPI() (stop func() error, err error) {
	started := time.Now().UTC()
	pid := os.Getpid()
	sub, err := s.nc.Subscribe(contract.StatsSubject, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		rs, ss := s.Stats()
		s.mu.Lock()
		holder := s.own.holder
		s.mu.Unlock()
		reply := StatsReply{
			Started: started, PID: pid, Holder: holder, Ready: s.Ready(),
			Routed: rs.Routed, Clamped: rs.Clamped, DeadLettered: rs.DeadLettered,
			RouterOwner: rs.Owner, RouterEpoch: rs.Epoch,
			DeadLetters: s.DeadLetters(),
			Levels:      make([]LevelStats, 0, len(ss)),
		}
		if s.cfg.IngressPartitions > 1 {
			for _, r := range s.RouterStats() {
				reply.Routers = append(reply.Routers, RouterReply{IngressPartition: r.IngressPartition, Lease: r.Lease,
					Owner: r.Owner, Epoch: r.Epoch, Routed: r.Routed, Clamped: r.Clamped, DeadLettered: r.DeadLettered})
			}
		}
		cancelled := s.cancelledPending(StatsCancelledSeqsMax)
		for _, sc := range ss {
			c := cancelled[sc.Stream]
			reply.Levels = append(reply.Levels, LevelStats{
				Stream: sc.Stream, Offset: sc.Offset, Delivered: sc.Delivered, DeadLettered: sc.DeadLettered,
				Retries: sc.Retries, Forwarded: sc.Forwarded, Pending: sc.Pending - min(sc.Pending, c.n),
				Cancelled: c.n, CancelledSeqs: c.lowest,
				OldestDueAgeSeconds: sc.OldestDueAge.Seconds(),
				Owner:               sc.Owner, Epoch: sc.Epoch,
			})
		}
		leases := s.Leases()
		reply.Leases = make([]LeaseReply, 0, len(leases))
		for _, l := range leases {
			reply.Leases = append(reply.Leases, LeaseReply{Key: l.Key, Held: l.Held, Epoch: l.Epoch, Gained: l.Gained, Failovers: l.Failovers})
		}
		b, err := json.Marshal(reply)
		if err != nil { // cannot happen: plain numbers and strings
			s.logger.Error("stats API: encode reply", slog.Any("error", err))
			return
		}
		if err := m.Respond(b); err != nil {
			s.logger.Warn("stats API: reply failed", slog.Any("error", err))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("deliver: stats API: subscribe %s: %w", contract.StatsSubject, err)
	}
	return sub.Unsubscribe, nil
}

// StatsCancelledSeqsMax is how many sequences of a level's cancelled
// messages a stats reply lists at most ([LevelStats].CancelledSeqs).
const StatsCancelledSeqsMax = 64

// cancelledView is one level's cancelled messages past its committed
// offset: how many, and the lowest of their sequences.
type cancelledView struct {
	n      uint64
	lowest []uint64
}

// CancelledPending returns, by level stream, how many cancelled messages
// each level this process owns holds past its committed offset (still in
// the level stream, never delivered; [ScannerStats].Pending counts them);
// levels with none are absent. It reads each level's cancel book, in
// memory (see [LevelStats].Cancelled).
func (s *Service) CancelledPending() map[string]uint64 {
	out := make(map[string]uint64)
	for stream, c := range s.cancelledPending(0) {
		out[stream] = c.n
	}
	return out
}

// cancelledPending returns, for every level this process owns now, its
// cancelled messages past the committed offset, from the level's cancel
// book, with the lowest keep of their sequences. It costs O(tombstones held) in memory, no I/O: the book holds only
// the tombstones of messages its scanner has not passed yet, or passed
// but not yet retired by the janitor (the offset moved past them a moment
// ago), so at most the level's cancelled-but-pending messages and a short
// tail.
func (s *Service) cancelledPending(keep int) map[string]cancelledView {
	s.mu.Lock()
	lvls := make([]*level.Level, 0, len(s.parts.levels))
	for _, l := range s.parts.levels {
		lvls = append(lvls, l)
	}
	s.mu.Unlock()
	out := make(map[string]cancelledView, len(lvls))
	for _, l := range lvls {
		if !l.Owned() {
			continue
		}
		n, lowest := l.PendingTombs(keep)
		if n > 0 {
			out[l.Stream()] = cancelledView{n: n, lowest: lowest}
		}
	}
	return out
}

// DeliveryDue returns a level-stream message's delivery due: its
// Delay-Due-At, when it is delivered to its target, also for a cascading
// message that waits at this level only until an earlier hop
// ([LevelDue]). ok is false if it does not parse (an epoch marker has
// none).
func DeliveryDue(h nats.Header) (due time.Time, ok bool) {
	t, err := time.Parse(time.RFC3339Nano, h.Get(contract.HeaderDueAt))
	return t, err == nil
}

// LevelDue returns when a scanner acts on a level-stream message with
// headers h: the end of its wait at this level if it cascades on
// (Delayd-Hop-Due), else its Delay-Due-At. ok is false if neither parses.
func LevelDue(h nats.Header) (due time.Time, ok bool) { return message.LevelDue(h) }
