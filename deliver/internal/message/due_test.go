package message

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestStripInternal(t *testing.T) {
	t.Parallel()
	h := nats.Header{
		// Removed: JetStream's direct-get and instruction headers, delayd's reserved headers.
		"Nats-Stream":                 {"DELAYD_1S"},
		"Nats-Sequence":               {"3"},
		"Nats-Time-Stamp":             {"2026-01-01T00:00:00Z"},
		"Nats-Subject":                {"delayd.level.1S.orders"},
		"Nats-Expected-Last-Sequence": {"2"},
		"Nats-Msg-Id":                 {"x"},
		"nats-msg-id":                 {"y"},
		"NATS-TTL":                    {"1s"},
		"Delayd-Msg-Id":               {"user-1"},
		"Delayd-Ingress":              {"delayd-1-2"},
		"delayd-anything":             {"z"},
		// Kept.
		"Delay-Enqueued-At": {"2026-01-01T00:00:00.000000000Z"},
		"Delay-Due-At":      {"2026-01-01T00:00:01.000000000Z"},
		"X-Nats-Foo":        {"kept"},
		"Natsy":             {"kept"},
		"Nats":              {"kept"},
		"Delay-Other":       {"kept"},
		"X-User":            {"1", "2"},
	}
	kept := nats.Header{
		"Delay-Enqueued-At": {"2026-01-01T00:00:00.000000000Z"},
		"Delay-Due-At":      {"2026-01-01T00:00:01.000000000Z"},
		"X-Nats-Foo":        {"kept"},
		"Natsy":             {"kept"},
		"Nats":              {"kept"},
		"Delay-Other":       {"kept"},
		"X-User":            {"1", "2"},
	}
	StripInternal(h)
	if len(h) != len(kept) {
		t.Errorf("after StripInternal: %v, want %v", h, kept)
	}
	for k, want := range kept {
		if got := h[k]; !slices.Equal(got, want) {
			t.Errorf("header %q = %q, want %q", k, got, want)
		}
	}
	StripInternal(nil) // must not panic
}
