package cancelapi

import (
	"errors"
	"testing"

	"github.com/delayd/delayd/contract"
)

// TestCancelStatus checks each cancel answer's Delay-Status code, and that
// the body stays the answer's text.
func TestCancelStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body string
		err  error
		want string
	}{
		{contract.CancelReplyCancelled, nil, "200"},
		{contract.CancelReplyNotFound, nil, "404"},
		{contract.CancelReplyDelivered, nil, "409"},
		{"error: x", ErrAmbiguousID, "400"},
		{"error: x", ErrRouterBehind, "503"},
		{"error: x", errors.New("stream info: timeout"), "500"},
	}
	for _, tt := range tests {
		m := replyMsg(tt.body, tt.err)
		if got := m.Header.Get(contract.HeaderStatus); got != tt.want {
			t.Errorf("replyMsg(%q, %v): %s %q, want %q", tt.body, tt.err, contract.HeaderStatus, got, tt.want)
		}
		if string(m.Data) != tt.body {
			t.Errorf("replyMsg(%q, %v): body %q, want it unchanged", tt.body, tt.err, m.Data)
		}
	}
}
