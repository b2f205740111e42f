package deliver

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// buildLevels builds Run's levels, one per level stream of streams, by
// stream name, each tuned by Config.Scanner. Their mergeGone forgets a
// merge key in every router's cache of merges; routed is their
// level.Wiring.Routed (the cancel API's routed wait), which their movers
// need to settle a move.
func (s *Service) buildLevels(streams []string, store *offsets.Store, targets *target.Bindings, merges *routing.MergeCaches, routed func(context.Context) (bool, error)) (levelSet, error) {
	start := time.Now()
	var clock level.Clock
	if s.cfg.Clock != nil {
		clock = s.cfg.Clock
	}
	knobs := s.cfg.Scanner
	out := make(levelSet, len(streams))
	for _, name := range streams {
		lc := level.Config{
			Stream: name, Offsets: store, Targets: targets, Prefix: s.cfg.Prefix,
			Logger: s.logger.With(slog.String("component", "scanner")), Clock: clock, StartGrace: s.cfg.StartGrace,
			Batch: knobs.Batch, BatchBytes: knobs.BatchBytes, Window: knobs.Window, PurgeEvery: knobs.PurgeEvery, MaxAttempts: knobs.MaxAttempts,
		}
		if s.cfg.OnDelivery != nil {
			stream := name
			lc.OnDelivery = func(l time.Duration) { s.cfg.OnDelivery(stream, l) }
		}
		if s.cfg.GraceAtStart {
			lc.StartedAt = start
		}
		var gate *level.OrderGate
		if d, ok := levels.ParseStreamName(name); ok && s.parts.boundaries[d] != nil {
			gate = level.NewOrderGate(name, s.parts.boundaries[d], store, mustJS(s.nc, 0))
		}
		// The level publishes synchronously (its deliveries go through its
		// own PubAck tracker on nc): no async-publish sizing.
		l, err := level.New(s.nc, mustJS(s.nc, 0), lc, level.Wiring{
			Reasons: &s.dead.reasons, Refused: &s.dead.refused, HopKey: s.parts.hopKey, Fenced: true, Gate: gate,
			MergeGone: merges.Forget, Routed: routed,
		})
		if err != nil {
			return nil, err
		}
		out[name] = l
	}
	return out, nil
}

// levelSet is a Service's levels by stream name, whether this replica
// owns them now or not. As the routers' [routing.Tails] it tells each
// level what a router wrote there (the pending count of its stats); the
// router's acker calls it.
type levelSet map[string]*level.Level

// Written is [level.Level.Written] of stream's level, if this replica
// knows it.
func (ls levelSet) Written(stream string, seq uint64) {
	if l := ls[stream]; l != nil {
		l.Written(seq)
	}
}

// levelOwners returns the [level.Owners] of levels: this
// replica's owner of a level while a term of its lease runs here, the
// owner on another replica otherwise. The routers ask them whether a
// merge key's message is pending ([routing.Owners]), the cancel API
// decides through them.
func (s *Service) levelOwners(levels levelSet) *level.Owners {
	return level.NewOwners(level.OwnersConfig{Conn: s.nc, Levels: levels, LeaseTTL: cmp.Or(s.cfg.LeaseTTL, lease.TTLDefault)})
}
