package routing

import (
	"context"

	"github.com/delayd/delayd/deliver/internal/index"
)

// Owners is what the router asks of the level streams' owners, wherever
// they run: this replica's, or another replica's over the level's decide
// subject. Merging asks it.
type Owners interface {
	// Pending reports whether the level message rec places has not been
	// handed to its target yet and is not cancelled; rec's hop and due
	// come from its index record. No answer is false: a merge is missed,
	// a message is never merged into one delivered.
	Pending(ctx context.Context, rec index.Record) bool

	// Passed returns the highest sequence stream's owner handed off; 0
	// without an answer.
	Passed(ctx context.Context, stream string) uint64
}

// Offsets is what the router reads of the level streams' committed
// offsets, for the re-index at start.
type Offsets interface {
	// Committed returns stream's committed offset, 0 if unknown.
	Committed(ctx context.Context, stream string) uint64
}

// Tails is told the sequences the level streams now hold, for observers
// such as a level's stats: after each confirmed level write, with the
// sequence the write got, and after each tail sync (at the start of a
// session and before a retry), with the stream's last sequence. (The
// level owners need no nudge: their pending pull request receives the
// message.) Calls come from one goroutine, the router's acker, one at a
// time, in ingress order; Written must not block, as the acker acks
// nothing meanwhile.
type Tails interface {
	Written(stream string, seq uint64)
}

// TailsFunc is a func as [Tails].
type TailsFunc func(stream string, seq uint64)

// Written calls f(stream, seq).
func (f TailsFunc) Written(stream string, seq uint64) { f(stream, seq) }

// noTails tells nobody: a router whose [Wiring] has no Tails.
type noTails struct{}

func (noTails) Written(string, uint64) {}
