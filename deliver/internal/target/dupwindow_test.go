package target

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// syncBuffer is a bytes.Buffer safe for a logger and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// warnings returns the WARN records logged, decoded.
func (b *syncBuffer) warnings(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["level"] == "WARN" {
			out = append(out, rec)
		}
	}
	return out
}

// TestShortDuplicateWindowWarnedOnce: a stream target whose duplicate
// window is under 2 minutes (20 s) gets one warning naming the stream and
// its window, however many of its subjects are looked at and however often
// the index refreshes; one with JetStream's default window (2 minutes)
// gets none, nor does a core subject.
func TestShortDuplicateWindowWarnedOnce(t *testing.T) {
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "SHORT", Subjects: []string{"short.>"}, Duplicates: 20 * time.Second},
		{Name: "LONG", Subjects: []string{"long.>"}}, // the server's default window, 2 minutes
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	b := New(nc, js, slog.New(slog.NewJSONHandler(&logs, nil)))
	for range 2 {
		if err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		for _, subject := range []string{"short.a", "short.b", "long.a", "core.a", "short.a"} {
			b.Bound(subject)
		}
	}
	w := logs.warnings(t)
	if len(w) != 1 {
		t.Fatalf("%d warnings, want 1 (for SHORT): %v", len(w), w)
	}
	if w[0]["stream"] != "SHORT" || w[0]["duplicate_window"] != float64(20*time.Second) { // JSON: nanoseconds
		t.Errorf("warning %v: want stream SHORT, duplicate_window 20s", w[0])
	}
}
