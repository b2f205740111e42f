package deliver

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// buildLevels builds Run's scanners, one per level stream of streams, by
// stream name. Their mergeGone forgets a merge key in every router of
// routersRef, which Run sets once it has built the routers.
func (s *Service) buildLevels(streams []string, store *offsets.Store, targets *TargetIndex, routersRef *atomic.Pointer[[]*Router]) (map[string]*Scanner, error) {
	start := time.Now()
	scanners := make(map[string]*Scanner, len(streams))
	for _, name := range streams {
		sc := s.cfg.Scanner
		sc.Stream, sc.Offsets, sc.Targets, sc.Prefix = name, store, targets, s.cfg.Prefix
		if s.cfg.OnDelivery != nil {
			stream := name
			sc.OnDelivery = func(l time.Duration) { s.cfg.OnDelivery(stream, l) }
		}
		sc.Logger = s.logger.With(slog.String("component", "scanner"))
		if s.cfg.Clock != nil {
			sc.Clock = s.cfg.Clock
		}
		sc.StartGrace = s.cfg.StartGrace
		if s.cfg.GraceAtStart {
			sc.StartedAt = start
		}
		var gate *level.OrderGate
		if d, ok := levels.ParseStreamName(name); ok && s.parts.boundaries[d] != nil {
			gate = level.NewOrderGate(name, s.parts.boundaries[d], store, mustJS(s.nc, 0))
		}
		// The level publishes synchronously (its deliveries go through its
		// own PubAck tracker on nc): no async-publish sizing.
		scanner, err := newScanner(s.nc, mustJS(s.nc, 0), sc, level.Wiring{
			Reasons: &s.dead.reasons, Refused: &s.dead.refused, HopKey: s.parts.hopKey, Fenced: true, Gate: gate,
			MergeGone: func(rec index.Record) {
				if rs := routersRef.Load(); rs != nil {
					for _, r := range *rs {
						r.forgetMerge(rec)
					}
				}
			},
		})
		if err != nil {
			return nil, err
		}
		scanners[name] = scanner
	}
	return scanners, nil
}

// serviceScanners is the router's view of a Service's scanners
// ([levelScanners]).
type serviceScanners struct {
	scanners map[string]*Scanner
	store    *offsets.Store
	owners   *level.PendingAsker // asks the owner of a level this replica does not own
}

// pendingAt answers from this replica's scanner when it owns the level
// (once its term's load loaded the offset and tombstones: it waits for
// that up to decidePendingWait), and otherwise asks the level's owner on
// its decide subject. No answer (no owner, a failover, a timeout) is "not
// pending": that costs a merge, never a message merged into one already
// delivered.
func (v serviceScanners) pendingAt(ctx context.Context, rec index.Record) bool {
	sc := v.scanners[rec.Stream]
	if sc == nil {
		return false
	}
	if pending, owned := sc.l.Pending(ctx, rec); owned {
		return pending
	}
	if v.owners != nil {
		return v.owners.Pending(ctx, rec)
	}
	return false
}

// passed answers from this replica's scanner when it owns the level, and
// otherwise asks the level's owner; 0 (nothing passed) without an answer.
func (v serviceScanners) passed(ctx context.Context, stream string) uint64 {
	sc := v.scanners[stream]
	if sc == nil {
		return 0
	}
	if passed, owned := sc.l.PassedHere(); owned {
		return passed // 0 until its term's load has loaded the offset
	}
	if v.owners != nil {
		return v.owners.Passed(ctx, stream)
	}
	return 0
}

func (v serviceScanners) committed(ctx context.Context, stream string) uint64 {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	off, err := v.store.Load(ctx, stream)
	if err != nil {
		return 0
	}
	return off
}

// levelCommitted returns the offset this replica's scanner of stream last
// committed, and whether it owns the level now; 0 and false for a level
// it does not own. The janitor reads it for the levels this replica owns,
// and the store for the others (Service.oldestPending).
func (s *Service) levelCommitted(stream string) (uint64, bool) {
	s.mu.Lock()
	sc := s.parts.scanners[stream]
	s.mu.Unlock()
	if sc == nil || !sc.l.Owned() {
		return 0, false
	}
	return sc.l.Committed(), true
}
