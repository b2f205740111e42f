package deliver

import (
	"errors"
	"testing"
	"time"
)

// TestDLQRefusals: a dead letter waits from its first refusal until it is
// stored, however often it is refused meanwhile; the router's waiting ones
// are forgotten when a new ingress session redelivers them.
func TestDLQRefusals(t *testing.T) {
	t.Parallel()
	var d dlqRefusals
	full := errors.New("maximum messages exceeded")
	start := time.Now()
	d.refused("DELAYD_1S", full)
	for time.Since(start) < 20*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	d.refused("DELAYD_1S", full) // a retry, refused again
	d.refused(routerRefusal+"delayd-1-7", full)
	got := d.snapshot()
	if got.Failures != 3 || got.Waiting != 2 || !errors.Is(got.LastErr, full) {
		t.Fatalf("snapshot = %+v, want 3 failures, 2 waiting, the last error", got)
	}
	if got.Oldest < 10*time.Millisecond {
		t.Errorf("oldest waiting for %s, want at least the 20 ms since the first refusal: the retry restarted the clock", got.Oldest)
	}
	if n := d.routerWaiting(); n != 1 {
		t.Errorf("routerWaiting = %d, want 1", n)
	}
	d.forget(routerRefusal)
	if got := d.snapshot(); got.Waiting != 1 {
		t.Errorf("after forget(router): %d waiting, want the scanner's 1", got.Waiting)
	}
	d.stored("DELAYD_1S")
	if got := d.snapshot(); got.Waiting != 0 || got.Oldest != 0 || got.Failures != 3 {
		t.Errorf("after stored: %+v, want nothing waiting and the failures still counted", got)
	}
	var none *dlqRefusals
	none.refused("x", full)
	none.stored("x")
	if got := none.snapshot(); got.Waiting != 0 {
		t.Errorf("nil tracker: %+v", got)
	}
}
