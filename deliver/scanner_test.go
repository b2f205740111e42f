package deliver

import (
	"context"
	"strings"
	"testing"

	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// TestScannerWiringRequired: a scanner built without what it shares with
// the rest of delayd fails at construction, naming what is missing,
// instead of running without a hop key or dead-letter accounting. One
// built on its own has all of it, of its own.
func TestScannerWiringRequired(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	store, err := offsets.New(context.Background(), js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ScannerConfig{Stream: "DELAYD_5S", Offsets: store, Targets: NewTargetIndex(nc, js, nil)}
	key := hopKey("0123456789abcdef0123456789abcdef")
	full := scannerWiring{reasons: &reasonCounts{}, refused: &dlqRefusals{}, hopKey: key}
	if _, err := newScanner(nc, js, cfg, full); err != nil {
		t.Fatalf("complete wiring refused: %v", err)
	}
	for _, tt := range []struct {
		name string
		edit func(*scannerWiring)
		want string
	}{
		{"no reason counts", func(w *scannerWiring) { w.reasons = nil }, "reason counts"},
		{"no refusals", func(w *scannerWiring) { w.refused = nil }, "refusals"},
		{"no hop key", func(w *scannerWiring) { w.hopKey = nil }, "hop key"},
	} {
		w := full
		tt.edit(&w)
		_, err := newScanner(nc, js, cfg, w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one naming %q", tt.name, err, tt.want)
		}
	}
	s, err := NewScanner(nc, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.cfg.hopKey) != hopKeySize || s.cfg.reasons == nil || s.cfg.refused == nil || s.cfg.mergeGone != nil {
		t.Errorf("NewScanner: hop key of %d bytes, reasons %v, refused %v, mergeGone set %v; want %d bytes, both set, none",
			len(s.cfg.hopKey), s.cfg.reasons != nil, s.cfg.refused != nil, s.cfg.mergeGone != nil, hopKeySize)
	}
}
