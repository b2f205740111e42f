package routing

import (
	"testing"

	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// TestMergeCaches: the router of ingress partition i places with the
// cache of partition i, which holds its placements only, and Forget frees a merge key in every partition's
// cache, as a level owner's cancel must reach every router.
func TestMergeCaches(t *testing.T) {
	t.Parallel()
	merges := NewMergeCaches(2)
	key := hop.Key("0123456789abcdef0123456789abcdef")
	parts := levels.Partitions{}.WithIngress(2)
	var routers []*Router
	for i := range 2 {
		r, err := New(nil, Config{Prefix: "delay", Levels: levels.MustParse("1s"), Partitions: parts, IngressPartition: i},
			Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key, Merges: merges})
		if err != nil {
			t.Fatal(err)
		}
		if r.merges != merges.byPart[i] {
			t.Errorf("router of ingress partition %d does not place with that partition's cache", i)
		}
		routers = append(routers, r)
	}
	k := index.MergeKey("tgt.x", "k1")
	for i, r := range routers {
		r.merges.remember(index.Record{Key: k, Stream: "DELAYD_1S", Seq: uint64(i + 1)})
	}
	for i, r := range routers { // each partition's placements in its own cache
		if rec, ok := r.merges.lookup(k); !ok || rec.Seq != uint64(i+1) {
			t.Errorf("partition %d's cache holds %+v (found %v); want its own placement, seq %d", i, rec, ok, i+1)
		}
	}
	merges.Forget(index.Record{Key: k, Gone: true, Target: "tgt.x"})
	for i, r := range routers {
		if rec, ok := r.merges.lookup(k); !ok || !rec.Gone {
			t.Errorf("partition %d's cache holds %+v (found %v) after Forget; want the key's cancelled record", i, rec, ok)
		}
	}
	if _, err := New(nil, Config{Prefix: "delay", Levels: levels.MustParse("1s")},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key, Merges: NewMergeCaches(0)}); err != nil {
		t.Errorf("one partition, its cache: %v", err)
	}
}
