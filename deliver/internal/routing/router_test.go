package routing

import (
	"strings"
	"testing"

	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// TestRouterWiringRequired: a router built without what it shares with
// the rest of delayd fails at construction, naming what is missing,
// instead of running without a hop key or dead-letter accounting.
func TestRouterWiringRequired(t *testing.T) {
	t.Parallel()
	cfg := Config{Prefix: "delay", Levels: levels.MustParse("1s")}
	key := hop.Key("0123456789abcdef0123456789abcdef")
	full := Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key}
	if _, err := New(nil, cfg, full); err != nil {
		t.Fatalf("complete wiring refused: %v", err)
	}
	for _, tt := range []struct {
		name string
		edit func(*Wiring)
		want string
	}{
		{"no reason counts", func(w *Wiring) { w.Reasons = nil }, "reason counts"},
		{"no refusals", func(w *Wiring) { w.Refused = nil }, "refusals"},
		{"no hop key", func(w *Wiring) { w.HopKey = nil }, "hop key"},
	} {
		w := full
		tt.edit(&w)
		_, err := New(nil, cfg, w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one naming %q", tt.name, err, tt.want)
		}
	}
	// A router on its own has its own hop key: no hop header is trusted.
	r, err := NewStandalone(nil, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.deps.HopKey) != hop.KeySize || r.deps.Owners != nil || r.deps.Offsets != nil {
		t.Errorf("NewStandalone: hop key of %d bytes, Owners %v, Offsets %v; want %d bytes and none", len(r.deps.HopKey), r.deps.Owners, r.deps.Offsets, hop.KeySize)
	}
}
