package deliver

import (
	"strings"
	"testing"

	"github.com/delayd/delayd/levels"
)

// TestRouterWiringRequired: a router built without what it shares with
// the rest of delayd fails at construction, naming what is missing,
// instead of running without a hop key or dead-letter accounting.
func TestRouterWiringRequired(t *testing.T) {
	t.Parallel()
	cfg := RouterConfig{Prefix: "delay", Levels: levels.MustParse("1s")}
	key := hopKey("0123456789abcdef0123456789abcdef")
	full := routerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: key}
	if _, err := newRouter(nil, cfg, full); err != nil {
		t.Fatalf("complete wiring refused: %v", err)
	}
	for _, tt := range []struct {
		name string
		edit func(*routerWiring)
		want string
	}{
		{"no reason counts", func(w *routerWiring) { w.reasons = nil }, "reason counts"},
		{"no refusals", func(w *routerWiring) { w.refused = nil }, "refusals"},
		{"no hop key", func(w *routerWiring) { w.hopKey = nil }, "hop key"},
	} {
		w := full
		tt.edit(&w)
		_, err := newRouter(nil, cfg, w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one naming %q", tt.name, err, tt.want)
		}
	}
	// A router on its own has its own hop key: no hop header is trusted.
	r, err := NewRouter(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.wiring.hopKey) != hopKeySize || r.wiring.scanners != nil {
		t.Errorf("NewRouter: hop key of %d bytes, scanners %v; want %d bytes and none", len(r.wiring.hopKey), r.wiring.scanners, hopKeySize)
	}
}
