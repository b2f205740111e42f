package deliver

import (
	"context"
	"log/slog"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/offsets"
)

// buildRouters builds Run's routers, one per ingress partition; each
// tells the scanners what it wrote and asks them, or the levels' owners
// elsewhere, whether a merge key's message is pending ([level.Owners]).
// Router i places with merges' cache of ingress partition i.
func (s *Service) buildRouters(lvls levelSet, store *offsets.Store, merges *routing.MergeCaches) ([]*routing.Router, error) {
	rc := s.cfg.Router
	rc.Prefix, rc.Levels, rc.Targets, rc.Replicas, rc.MaxDelay = s.cfg.Prefix, s.cfg.Levels, s.cfg.Targets, s.cfg.Replicas, s.cfg.MaxDelay
	rc.Partitions = s.cfg.Partitions
	inflight := rc.MaxInFlight
	if inflight == 0 {
		inflight = RouterMaxInFlightDefault
	}
	// One router per ingress partition (docs/operations.md#ingress-partitions).
	routers := make([]*routing.Router, s.cfg.IngressPartitions)
	owners := s.levelOwners(lvls)
	for i := range routers {
		rc := rc
		rc.IngressPartition = i
		rc.Logger = s.logger.With(slog.String("component", "router"))
		if len(routers) > 1 {
			rc.Logger = rc.Logger.With(slog.Int("ingress_partition", i))
		}
		// Every level write is followed by one or two index writes.
		router, err := routing.New(mustJS(s.nc, 3*inflight+16), rc.routing(), routing.Wiring{
			Reasons: &s.dead.reasons, Refused: &s.dead.refused, HopKey: s.parts.hopKey,
			Owners:     owners,
			Offsets:    storeOffsets{store},
			Tails:      lvls,
			Merges:     merges,
			LookupConn: s.cfg.LookupConn,
		})
		if err != nil {
			return nil, err
		}
		router.SetTailHook(s.hooks.tailHook)
		routers[i] = router
	}
	return routers, nil
}

// storeOffsets reads the level streams' committed offsets from the
// offsets store for the router's re-index at start ([routing.Offsets]).
type storeOffsets struct{ store *offsets.Store }

func (o storeOffsets) Committed(ctx context.Context, stream string) uint64 {
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	off, err := o.store.Load(ctx, stream)
	if err != nil {
		return 0
	}
	return off
}
