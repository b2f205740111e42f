//go:build long

package integration

import (
	"testing"
	"time"
)

// TestAnyDelayFine is [TestAnyDelay] through the table "100ms 300ms 1s":
// each message at the target before any message due more than 50 ms (half
// the smallest level) later. That margin is below the lateness a starved
// machine adds (beside a CPU hog on both cores: p50 71 ms, p99 403 ms, and
// three such pairs stored the other way round), so it runs with the long
// suites, on a machine that is not starved.
func TestAnyDelayFine(t *testing.T) {
	t.Parallel()
	anyDelay(t, "100ms 300ms 1s", 100*time.Millisecond, 60, 2500)
}
