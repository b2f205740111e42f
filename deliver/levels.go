package deliver

import (
	"cmp"
	"log/slog"
	"time"

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

// levelSet is a Service's levels by stream name, whether this replica
// owns them now or not. As the routers' [routing.Tails] it tells each
// level what a router wrote there (the pending count of its stats); the
// router's acker calls it.
type levelSet map[string]*level.Level

// levelsOf returns the levels of scanners.
func levelsOf(scanners map[string]*Scanner) levelSet {
	levels := make(levelSet, len(scanners))
	for name, sc := range scanners {
		levels[name] = sc.l
	}
	return levels
}

// Written is [level.Level.Written] of stream's level, if this replica
// knows it.
func (ls levelSet) Written(stream string, seq uint64) {
	if l := ls[stream]; l != nil {
		l.Written(seq)
	}
}

// levelOwners returns the [level.Owners] of scanners' levels: this
// replica's owner of a level while a term of its lease runs here, the
// owner on another replica otherwise. The routers ask them whether a
// merge key's message is pending ([routing.Owners]), the cancel API
// decides through them.
func (s *Service) levelOwners(scanners map[string]*Scanner) *level.Owners {
	return level.NewOwners(level.OwnersConfig{Conn: s.nc, Levels: levelsOf(scanners), LeaseTTL: cmp.Or(s.cfg.LeaseTTL, lease.TTLDefault)})
}
