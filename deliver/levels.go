package deliver

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/internal/lease"
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

// levelOwners returns the [level.Owners] of scanners' levels: this
// replica's owner of a level while a term of its lease runs here, the
// owner on another replica otherwise.
func (s *Service) levelOwners(scanners map[string]*Scanner) *level.Owners {
	levels := make(map[string]*level.Level, len(scanners))
	for name, sc := range scanners {
		levels[name] = sc.l
	}
	return level.NewOwners(level.OwnersConfig{Conn: s.nc, Levels: levels, LeaseTTL: cmp.Or(s.cfg.LeaseTTL, lease.TTLDefault)})
}

// serviceScanners is the router's view of a Service's levels
// ([routing.Owners], through routerOwners): their owners' answers.
type serviceScanners struct {
	owners *level.Owners
}

// pendingAt is [level.Owners.Pending].
func (v serviceScanners) pendingAt(ctx context.Context, rec index.Record) bool {
	return v.owners.Pending(ctx, rec)
}

// passed is [level.Owners.Passed].
func (v serviceScanners) passed(ctx context.Context, stream string) uint64 {
	return v.owners.Passed(ctx, stream)
}
