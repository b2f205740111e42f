package routing

import (
	"strconv"
	"testing"

	"github.com/delayd/delayd/deliver/internal/message"
)

func TestParseIngressRef(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		id  string
		seq uint64
	}{
		{"1767225600123456789", 1},
		{"1767225600123456789", 42},
		{"1", 1<<64 - 1},
		{"0", 0},
	} {
		r := &Router{run: runState{ingressID: tt.id}}
		ref := r.ingressRef(tt.seq)
		if want := "delayd-" + tt.id + "-" + strconv.FormatUint(tt.seq, 10); ref != want {
			t.Errorf("ingressRef(%d) = %q, want %q", tt.seq, ref, want)
		}
		id, seq, ok := message.ParseIngressRef(ref)
		if !ok || id != tt.id || seq != tt.seq {
			t.Errorf("parseIngressRef(%q) = %q, %d, %v; want %q, %d, true", ref, id, seq, ok, tt.id, tt.seq)
		}
	}
	for _, bad := range []string{
		"",
		"delayd-",
		"delayd-123",
		"delayd-123-",
		"delayd-123-x",
		"delayd-123--1",
		"delayd-123-18446744073709551616", // overflows uint64
		"user-id-1",
		"Delayd-123-4",
		"123-4",
	} {
		if id, seq, ok := message.ParseIngressRef(bad); ok {
			t.Errorf("parseIngressRef(%q) = %q, %d, true; want not ok", bad, id, seq)
		}
	}
}
