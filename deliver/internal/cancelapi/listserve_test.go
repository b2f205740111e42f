package cancelapi

import (
	"fmt"
	"testing"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/level"
)

// TestListBusyAnswer: a busy list (its queue full, or its reads not
// granted in time) is answered with the list's own text, not the cancel
// queue's, and the cancel API's busy code (429); a cancel-all's busy
// (listErrorMsg, shared) keeps the cancel queue's text.
func TestListBusyAnswer(t *testing.T) {
	t.Parallel()
	for _, err := range []error{errListBusy, fmt.Errorf("paced read: %w", level.ErrCancelBusy)} {
		m := listAnswer(err)
		if got, want := string(m.Data), "error: busy: too many list requests waiting; try again"; got != want {
			t.Errorf("busy answer to %v: %q, want %q", err, got, want)
		}
		if got := m.Header.Get(contract.HeaderStatus); got != fmt.Sprint(contract.CancelStatusBusy) {
			t.Errorf("busy answer to %v: code %s, want %d", err, got, contract.CancelStatusBusy)
		}
	}
	if got, want := string(listErrorMsg(fmt.Errorf("x: %w", level.ErrCancelBusy)).Data), "error: "+level.ErrCancelBusy.Error(); got != want {
		t.Errorf("cancel-all busy answer %q, want %q", got, want)
	}
}
