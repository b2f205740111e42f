package level

import (
	"context"
	"strings"
	"testing"

	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/target"
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
	cfg := Config{Stream: "DELAYD_5S", Offsets: store, Targets: target.New(nc, js, nil)}
	key := hop.Key("0123456789abcdef0123456789abcdef")
	full := Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: key}
	if _, err := New(nc, js, cfg, full); err != nil {
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
		_, err := New(nc, js, cfg, w)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one naming %q", tt.name, err, tt.want)
		}
	}
	s, err := NewForTest(nc, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.cfg.HopKey) != hop.KeySize || s.cfg.Reasons == nil || s.cfg.Refused == nil || s.cfg.MergeGone != nil {
		t.Errorf("NewForTest: hop key of %d bytes, reasons %v, refused %v, mergeGone set %v; want %d bytes, both set, none",
			len(s.cfg.HopKey), s.cfg.Reasons != nil, s.cfg.Refused != nil, s.cfg.MergeGone != nil, hop.KeySize)
	}
}
