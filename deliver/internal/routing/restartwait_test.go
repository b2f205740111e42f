package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/internal/hedge"
)

// TestRestartWaitCapped: the router's wait before its next session after
// a session that ended on a request nobody answered (a timeout, no
// responders: a hung server or leader, or one being elected) is at most
// hedge.AfterLeader however many sessions failed so; after other errors
// it grows to the backoff's cap.
func TestRestartWaitCapped(t *testing.T) {
	t.Parallel()
	unanswered := []error{
		fmt.Errorf("create ingress consumer: %w", context.DeadlineExceeded),
		fmt.Errorf("ingress stream: %w", nats.ErrTimeout),
		fmt.Errorf("list ingress consumers: %w", nats.ErrNoResponders),
	}
	for _, err := range unanswered {
		retry := backoff.New(100*time.Millisecond, 5*time.Second)
		for i := range 30 {
			if d := restartWait(retry, err); d > hedge.AfterLeader {
				t.Fatalf("after %d sessions ended on %q: wait %s, want at most %s", i+1, err, d, hedge.AfterLeader)
			}
		}
	}
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	var longest time.Duration
	for range 30 {
		longest = max(longest, restartWait(retry, fmt.Errorf("%w: ingress deliveries 3 to 4 did not arrive", errDeliveryLost)))
	}
	if longest <= hedge.AfterLeader {
		t.Errorf("after 30 sessions ended on a lost delivery the longest wait was %s, want the backoff grown past %s", longest, hedge.AfterLeader)
	}
}
