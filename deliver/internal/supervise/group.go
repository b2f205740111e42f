// Package supervise runs a process's long-lived parts as one tree
// (docs/reshape.md#31-the-supervisor): each part is a [Component] run on
// one goroutine of a [Group]; the first part to fail stops the others, and
// [Group.Wait] returns once every part has returned, so nothing a Group
// started outlives its Wait.
package supervise

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// Component is a long-lived part. Run returns nil once ctx is done (a
// clean stop; context.Canceled is not an error), or an error if it cannot
// run at all. It starts nothing that outlives its Run.
type Component interface {
	Run(ctx context.Context) error
}

// Func adapts a function to a [Component].
type Func func(ctx context.Context) error

// Run calls f(ctx).
func (f Func) Run(ctx context.Context) error { return f(ctx) }

// Group runs components, each on one goroutine: the first error cancels
// the others' context, and [Group.Wait] returns it once all have
// returned. A Group made inside a component of another Group (with the
// context that component got) fails its parent at its first error too,
// so one error stops the whole tree at once, as if every part ran in one
// Group.
//
// Go and Wait are called by the goroutine that made the Group; each
// component's goroutine writes first and running under mu when it
// returns.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	parent *Group // the Group whose component made this one; nil at the root
	logger *slog.Logger
	wg     sync.WaitGroup

	mu      sync.Mutex
	first   error    // the first error a component returned
	running []string // the names of the components not returned yet
}

type groupKey struct{}

// New returns a Group whose components run with a context derived from
// ctx; it ends when ctx does, at the first error, or at Wait.
func New(ctx context.Context, logger *slog.Logger) *Group {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	parent, _ := ctx.Value(groupKey{}).(*Group)
	g := &Group{parent: parent, logger: logger}
	cctx, cancel := context.WithCancel(ctx)
	g.ctx, g.cancel = context.WithValue(cctx, groupKey{}, g), cancel
	return g
}

// Go runs c.Run on a goroutine of its own, with the Group's context. name
// names it in [Group.Running] and in the debug line of its error.
func (g *Group) Go(name string, c Component) {
	g.mu.Lock()
	g.running = append(g.running, name)
	g.mu.Unlock()
	g.wg.Go(func() {
		err := c.Run(g.ctx)
		g.mu.Lock()
		if i := slices.Index(g.running, name); i >= 0 {
			g.running = slices.Delete(g.running, i, i+1)
		}
		g.mu.Unlock()
		if err != nil {
			g.logger.Debug("component failed; stopping the others", slog.String("component", name), slog.Any("error", err))
			g.fail(err)
		}
	})
}

// fail records err if it is the first and cancels the Group's context,
// and its parent's.
func (g *Group) fail(err error) {
	g.mu.Lock()
	if g.first == nil {
		g.first = err
	}
	g.mu.Unlock()
	g.cancel()
	if g.parent != nil {
		g.parent.fail(err)
	}
}

// Running returns the names of the components that have not returned
// yet, in the order they were started.
func (g *Group) Running() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.running)
}

// Wait waits until every component has returned, ends the Group's
// context, and returns the first error a component returned (nil if none).
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.first
}
