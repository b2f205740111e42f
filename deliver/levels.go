package deliver

import (
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// buildLevels builds Run's scanners, one per level stream of streams, by
// stream name. Their mergeGone forgets a merge key in every router's cache
// of merges.
func (s *Service) buildLevels(streams []string, store *offsets.Store, targets *TargetIndex, merges *routing.MergeCaches) (map[string]*Scanner, error) {
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
			MergeGone: merges.Forget,
		})
		if err != nil {
			return nil, err
		}
		scanners[name] = scanner
	}
	return scanners, nil
}

// serviceScanners is the router's view of a Service's scanners
// ([routing.Owners], through routerOwners).
type serviceScanners struct {
	scanners map[string]*Scanner
	owners   *level.PendingAsker // asks the owner of a level this replica does not own
}

// pendingAt answers from this replica's scanner when it owns the level
// (once its term's start loaded the offset and tombstones: it waits for
// that up to decidePendingWait), and otherwise asks the level's owner on
// its decide subject. No answer (no owner, a failover, a timeout) is "not
// pending": that costs a merge, never a message merged into one already
// delivered.
func (v serviceScanners) pendingAt(ctx context.Context, rec index.Record) bool {
	sc := v.scanners[rec.Stream]
	switch {
	case sc == nil:
		return false
	case sc.l.Owned():
		for deadline := time.Now().Add(level.DecidePendingWait); !sc.l.Loaded(); {
			if !sc.l.Owned() || time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond) // a term's first moments only
		}
		return sc.pendingAt(rec)
	case v.owners != nil:
		return v.owners.Pending(ctx, rec)
	}
	return false
}

// passed answers from this replica's scanner when it owns the level, and
// otherwise asks the level's owner; 0 (nothing passed) without an answer.
func (v serviceScanners) passed(ctx context.Context, stream string) uint64 {
	sc := v.scanners[stream]
	switch {
	case sc == nil:
		return 0
	case sc.l.Owned():
		if !sc.l.Loaded() {
			return 0 // its term's start has not loaded the offset yet
		}
		return sc.l.Passed()
	case v.owners != nil:
		return v.owners.Passed(ctx, stream)
	}
	return 0
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
