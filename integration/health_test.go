package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/integration/internal/itest"
)

// TestRouterLevelWriteRefused makes the router's writes to one level stream
// fail for good (DELAYD_100MS at max_msgs 1 with discard-new: the scanner
// always keeps the stream's last message). The router retries the write in
// every recovery round, but a retry is not progress: readiness names the
// level stream once it has failed for 30 s, not before, and recovers once
// the stream takes the write, which is then delivered.
func TestRouterLevelWriteRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 30 s stall threshold: skipped when testing.Short()")
	}
	t.Parallel()
	b := itest.Setup(t)
	ctx := context.Background()
	b.CreateStream("OK", "ok.>")
	b.StartDelayd("100ms 300ms")
	setMaxMsgs := func(n int64) {
		s, err := b.JS.Stream(ctx, "DELAYD_100MS")
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgs, cfg.Discard = n, jetstream.DiscardNew
		if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	b.Publish("delay.ok.first", []byte("1"), itest.Level(1))
	itest.WaitFor(t, 20*time.Second, "the first message delivered", func() bool { return b.StreamCount("OK") == 1 })
	// The level stream keeps its last delivered message (the router's
	// tail; the router's epoch marker before it is purged): once it holds
	// only that, a limit of one message refuses the next write.
	itest.WaitFor(t, 20*time.Second, "DELAYD_100MS purged to its last delivered message", func() bool { return b.StreamCount("DELAYD_100MS") == 1 })
	setMaxMsgs(1)

	published := time.Now()
	b.Publish("delay.ok.second", []byte("2"), itest.Level(1))
	for {
		why := strings.Join(b.Svc.Unready(), "; ")
		since := time.Since(published)
		if why != "" {
			if since < 30*time.Second {
				t.Fatalf("unready %s after the refused write, before the 30 s threshold: %s", since, why)
			}
			if !strings.Contains(why, "DELAYD_100MS") {
				t.Fatalf("unready %q does not name the level stream DELAYD_100MS", why)
			}
			t.Logf("unready %s after the publish: %s", since.Round(time.Millisecond), why)
			break
		}
		if since > 40*time.Second {
			t.Fatalf("still ready %s after the publish: the failing level write was never reported", since)
		}
		time.Sleep(100 * time.Millisecond)
	}

	setMaxMsgs(-1)
	itest.WaitFor(t, 20*time.Second, "the second message delivered", func() bool { return b.StreamCount("OK") == 2 })
	itest.WaitFor(t, 20*time.Second, "ready again", b.Svc.Ready)
}
