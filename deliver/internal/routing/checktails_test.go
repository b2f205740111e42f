package routing

import (
	"errors"
	"testing"

	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestCheckTailsCountsFence: after a failed write's resync, a level
// stream whose last router write (lastRouted) is past what this term
// submitted to it fences the router (errRouterFenced, naming the stream)
// and counts once in FencedWrites under that stream; a tail at or below
// what was submitted, or a router on its own (epoch 0), is no fence and
// counts nothing. (TestStaleRouterFencedMarkersPurged accepts this fence
// or the ingress consumer's, and meets the consumer's first, so it does
// not see this count.)
func TestCheckTailsCountsFence(t *testing.T) {
	t.Parallel()
	nc, _ := natstest.Connect(t)
	table := levels.MustParse("1h")
	r, err := New(mustJS(nc, 0), Config{Prefix: "delay", Levels: table},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hop.Key("k")})
	if err != nil {
		t.Fatal(err)
	}
	level, _ := table.Level(1)
	stream := level.Stream()
	i := -1
	for j, w := range r.writers.all {
		if w.stream == stream {
			i = j
		}
	}
	if i < 0 {
		t.Fatalf("no writer of %s", stream)
	}
	submitted := make([]uint64, len(r.writers.all))
	submitted[i] = 7
	r.writers.all[i].lastRouted.Store(7)

	r.run.term = ownership.Term{Epoch: 5}
	if err := r.checkTails(submitted); err != nil {
		t.Fatalf("tail at this term's last write: %v, want no fence", err)
	}
	r.writers.all[i].lastRouted.Store(8)
	r.run.term = ownership.Term{}
	if err := r.checkTails(submitted); err != nil {
		t.Fatalf("router on its own (epoch 0), tail past its write: %v, want no check", err)
	}
	if st := r.Stats(); len(st.FencedWrites) != 0 {
		t.Fatalf("fenced writes %v before any fence, want none", st.FencedWrites)
	}
	r.run.term = ownership.Term{Epoch: 5}
	if err := r.checkTails(submitted); !errors.Is(err, errRouterFenced) {
		t.Fatalf("tail 8 past this term's last write 7: %v, want errRouterFenced", err)
	}
	if st := r.Stats(); len(st.FencedWrites) != 1 || st.FencedWrites[stream] != 1 {
		t.Fatalf("fenced writes %v, want %s: 1", st.FencedWrites, stream)
	}
}
