package deliver

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
		{"publisher's id first", nats.Header{hdrMsgID: {"order-42"}, hdrOrigin: {"delayd-1-7"}, hdrIngress: {"delayd-2-9"}}, "uorder-42"},
		{"origin before ingress", nats.Header{hdrOrigin: {"delayd-1-7"}, hdrIngress: {"delayd-2-9"}}, "s7"},
		{"ingress", nats.Header{hdrIngress: {"delayd-2-9"}}, "s9"},
		{"empty id is no id", nats.Header{hdrMsgID: {""}, hdrIngress: {"delayd-2-9"}}, "s9"},
		{"origin that does not parse", nats.Header{hdrOrigin: {"garbage"}, hdrIngress: {"delayd-2-9"}}, ""},
		{"ingress that does not parse", nats.Header{hdrIngress: {"delayd-2-x"}}, ""},
		{"nothing", nats.Header{}, ""},
	}
	for _, tt := range tests {
		if got := levelKey(tt.h); got != tt.want {
			t.Errorf("%s: levelKey = %q, want %q", tt.name, got, tt.want)
		}
	}
}
