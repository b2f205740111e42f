package integration

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestStartLogNoNullError starts the delayd binary against a NATS URL where
// nothing listens, and checks its JSON log: the "not reachable yet" warning
// is there, and no line carries an "error" attribute without an error (a
// nil error logged as "error":null).
func TestStartLogNoNullError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a free port: nothing listens there now
	p := b.startProcess("DELAYD_NATS_URL=nats://"+addr, "DELAYD_LOG_LEVEL=info")
	waitFor(t, 60*time.Second, "the not-reachable warning", func() bool {
		return strings.Contains(p.out.String(), "NATS not reachable yet")
	})
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, `"error":null`) {
			t.Errorf("log line with a nil error: %s", line)
		}
	}
}
