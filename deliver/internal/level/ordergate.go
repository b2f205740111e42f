package level

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/offsets"
)

// OrderGate holds a scanner's new messages while another stream of its
// level still holds old ones (see "Partition changes and per-key order"
// in deliver/internal/resource/boundaries.go). The scanner's goroutine only.
type OrderGate struct {
	own    uint64            // this stream's boundary: later sequences are new
	others map[string]uint64 // the level's other streams whose old messages may be pending, by boundary
	store  *offsets.Store
	js     jetstream.JetStream
}

// NewOrderGate returns the gate of stream among boundaries (the level's
// streams' boundaries), or nil if no other stream of the level holds old
// messages.
func NewOrderGate(stream string, boundaries map[string]uint64, store *offsets.Store, js jetstream.JetStream) *OrderGate {
	others := maps.Clone(boundaries)
	delete(others, stream)
	if len(others) == 0 {
		return nil
	}
	return &OrderGate{own: boundaries[stream], others: others, store: store, js: js}
}

// orderGatePoll is how often a held scanner looks at the old messages again.
const orderGatePoll = 50 * time.Millisecond

// holds reports whether the message at seq must wait: it is new, and
// another stream of the level still holds an old message. It names that
// stream. An error (a failed read) holds too: it is looked at again.
func (g *OrderGate) holds(ctx context.Context, seq uint64) (string, error) {
	if g == nil || seq <= g.own || len(g.others) == 0 {
		return "", nil
	}
	for _, name := range slices.Sorted(maps.Keys(g.others)) {
		boundary := g.others[name]
		rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		committed, err := g.store.Load(rctx, name)
		if errors.Is(err, offsets.ErrNotFound) {
			committed, err = 0, nil
		}
		if err == nil && committed < boundary {
			// Not passed yet: unless its old messages are gone (the
			// stream deleted or purged by hand), it holds one.
			var str jetstream.Stream
			str, err = g.js.Stream(rctx, name)
			switch {
			case errors.Is(err, jetstream.ErrStreamNotFound):
				err, committed = nil, boundary
			case err == nil:
				if st := str.CachedInfo().State; st.Msgs == 0 || st.FirstSeq > boundary {
					committed = boundary
				}
			}
		}
		cancel()
		if err != nil {
			return name, fmt.Errorf("order gate: offset of %s: %w", name, err)
		}
		if committed < boundary {
			return name + " up to sequence " + strconv.FormatUint(boundary, 10), nil
		}
		delete(g.others, name) // passed for good: nothing is written to it under the old count again
	}
	return "", nil
}
