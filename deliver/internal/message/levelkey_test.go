package message

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestLevelKey: a level message's index key is its publisher's id, else
// the ingress sequence of its first placement (Delayd-Origin, which a
// cascading message carries, before Delayd-Ingress); a reference that does
// not parse gives no key, and the ingress is not consulted then.
func TestLevelKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    nats.Header
		want string
	}{
		{"publisher's id first", nats.Header{HdrMsgID: {"order-42"}, HdrOrigin: {"delayd-1-7"}, HdrIngress: {"delayd-2-9"}}, "uorder-42"},
		{"origin before ingress", nats.Header{HdrOrigin: {"delayd-1-7"}, HdrIngress: {"delayd-2-9"}}, "s7"},
		{"ingress", nats.Header{HdrIngress: {"delayd-2-9"}}, "s9"},
		{"empty id is no id", nats.Header{HdrMsgID: {""}, HdrIngress: {"delayd-2-9"}}, "s9"},
		{"origin that does not parse", nats.Header{HdrOrigin: {"garbage"}, HdrIngress: {"delayd-2-9"}}, ""},
		{"ingress that does not parse", nats.Header{HdrIngress: {"delayd-2-x"}}, ""},
		{"nothing", nats.Header{}, ""},
	}
	for _, tt := range tests {
		if got := LevelKey(tt.h); got != tt.want {
			t.Errorf("%s: LevelKey = %q, want %q", tt.name, got, tt.want)
		}
	}
}
