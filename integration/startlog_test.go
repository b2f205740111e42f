package integration

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
)

// TestStartLogNoNullError starts the delayd binary against a NATS URL where
// nothing listens, and checks its JSON log: the "not reachable yet" warning
// is there, and no line carries an "error" attribute without an error (a
// nil error logged as "error":null).
func TestStartLogNoNullError(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a free port: nothing listens there now
	p := b.StartProcess("DELAYD_NATS_URL=nats://"+addr, "DELAYD_LOG_LEVEL=info")
	itest.WaitFor(t, 60*time.Second, "the not-reachable warning", func() bool {
		return strings.Contains(p.Out.String(), "NATS not reachable yet")
	})
	for _, line := range strings.Split(p.Out.String(), "\n") {
		if strings.Contains(line, `"error":null`) {
			t.Errorf("log line with a nil error: %s", line)
		}
	}
}
