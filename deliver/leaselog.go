package deliver

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/deliver/internal/ownership"
)

// gainSummaryAfter is how long the gains log gathers lease gains after the
// first of a burst before it logs them in one line.
const gainSummaryAfter = time.Second

// gainLog logs the leases this replica gains, one line at info per burst
// ("leases gained": how many, which, with their epochs, and how many it
// holds now) instead of one line per lease: a replica gains every lease
// at start (31 with the default table), and a dead replica's share at a
// failover. Each gain is also logged on its own, at debug, by its
// elector. The summary names every lease it gained, so a log still says
// who owns what after a failover. Hand-overs and losses are logged one
// line each, at info and warn, by the electors.
//
// The electors' goroutines report gains ([gainLog.gained]); run, on its
// own goroutine, logs them. mu guards pending.
type gainLog struct {
	logger *slog.Logger
	held   func() int // how many leases this replica holds now
	after  time.Duration
	wake   chan struct{}

	mu      sync.Mutex
	pending []string // "<key>@<epoch>", in the order gained
}

func newGainLog(logger *slog.Logger, held func() int) *gainLog {
	return &gainLog{logger: logger, held: held, after: gainSummaryAfter, wake: make(chan struct{}, 1)}
}

// gained records a gain; safe from any goroutine, never blocks.
func (g *gainLog) gained(ev ownership.Event) {
	g.mu.Lock()
	g.pending = append(g.pending, strings.TrimPrefix(ev.Key, "level.")+"@"+strconv.FormatUint(ev.Epoch, 10))
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// run logs the gains gathered for g.after after the first of each burst,
// until ctx is done, and then what is left; it returns nil.
func (g *gainLog) run(ctx context.Context) error {
	defer g.flush()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.wake:
		}
		t := time.NewTimer(g.after)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		g.flush()
	}
}

// flush logs the pending gains, if any.
func (g *gainLog) flush() {
	g.mu.Lock()
	gained := g.pending
	g.pending = nil
	g.mu.Unlock()
	if len(gained) == 0 {
		return
	}
	levels := 0
	for _, k := range gained {
		if strings.HasPrefix(k, "DELAYD_") {
			levels++
		}
	}
	slices.Sort(gained)
	g.logger.Info("leases gained", slog.Int("count", len(gained)), slog.Int("levels", levels),
		slog.Int("held", g.held()), slog.String("leases", strings.Join(gained, " ")))
}
