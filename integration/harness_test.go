package integration

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// parseTime parses a Delay-*-At header.
func parseTime(t *testing.T, h nats.Header, key string) time.Time {
	t.Helper()
	v := h.Get(key)
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("%s=%q: %v", key, v, err)
	}
	if len(v) != len("2006-01-02T15:04:05.000000000Z") || v[len(v)-1] != 'Z' {
		t.Fatalf("%s=%q: want RFC 3339 with nanoseconds in UTC", key, v)
	}
	return ts
}
