package deliver

import (
	"context"
	"log/slog"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/offsets"
)

// buildRouters builds Run's routers, one per ingress partition; each
// tells the scanners what it wrote and asks them, or the levels' owners
// elsewhere, whether a merge key's message is pending ([serviceScanners]).
func (s *Service) buildRouters(scanners map[string]*Scanner, store *offsets.Store) ([]*Router, error) {
	rc := s.cfg.Router
	rc.Prefix, rc.Levels, rc.Targets, rc.Replicas, rc.MaxDelay = s.cfg.Prefix, s.cfg.Levels, s.cfg.Targets, s.cfg.Replicas, s.cfg.MaxDelay
	rc.Partitions = s.cfg.Partitions
	rc.OnRouted = func(stream string, seq uint64) {
		if sc := scanners[stream]; sc != nil {
			sc.Written(seq)
		}
	}
	inflight := rc.MaxInFlight
	if inflight == 0 {
		inflight = RouterMaxInFlightDefault
	}
	// One router per ingress partition (docs/operations.md#ingress-partitions).
	routers := make([]*Router, s.cfg.IngressPartitions)
	owners := s.levelOwners(scanners)
	for i := range routers {
		rc := rc
		rc.IngressPartition = i
		rc.Logger = s.logger.With(slog.String("component", "router"))
		if len(routers) > 1 {
			rc.Logger = rc.Logger.With(slog.Int("ingress_partition", i))
		}
		// Every level write is followed by one or two index writes.
		router, err := newRouter(mustJS(s.nc, 3*inflight+16), rc, routing.Wiring{
			Reasons: &s.dead.reasons, Refused: &s.dead.refused, HopKey: s.parts.hopKey,
			Scanners:   routerScanners{serviceScanners{owners: owners, store: store}},
			LookupConn: s.cfg.LookupConn,
		})
		if err != nil {
			return nil, err
		}
		router.r.SetTailHook(s.hooks.tailHook)
		routers[i] = router
	}
	return routers, nil
}

// routerScanners is [serviceScanners] as the router asks it
// ([routing.LevelScanners]).
type routerScanners struct{ v serviceScanners }

func (s routerScanners) PendingAt(ctx context.Context, rec index.Record) bool {
	return s.v.pendingAt(ctx, rec)
}

func (s routerScanners) Passed(ctx context.Context, stream string) uint64 {
	return s.v.passed(ctx, stream)
}

func (s routerScanners) Committed(ctx context.Context, stream string) uint64 {
	return s.v.committed(ctx, stream)
}
