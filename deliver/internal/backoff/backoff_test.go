package backoff

import (
	"testing"
	"time"
)

// TestBackoffCapped: docs/guarantees.md#failing-targets: retries back off with
// capped, jittered backoff, up to 5 s. Each wait is within [cur/2, cur],
// cur doubles from the minimum, and no wait exceeds the cap however many
// failures; reset starts from the minimum again.
func TestBackoffCapped(t *testing.T) {
	t.Parallel()
	b := New(100*time.Millisecond, 5*time.Second)
	var maxWait time.Duration
	for i := range 50 {
		d := b.Next()
		if d < b.cur/2 || d > b.cur {
			t.Fatalf("wait %d: %s outside [%s, %s]", i, d, b.cur/2, b.cur)
		}
		if d > 5*time.Second {
			t.Fatalf("wait %d: %s beyond the 5s cap", i, d)
		}
		maxWait = max(maxWait, d)
	}
	if b.cur != 5*time.Second || maxWait < 2500*time.Millisecond {
		t.Errorf("after 50 failures: cur %s, longest wait %s; want the cap reached", b.cur, maxWait)
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %s, want at most the 100ms minimum", d)
	}
}
