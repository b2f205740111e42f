package integration

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestDeadLetterRefusedLogsOnce: while DELAYD_DLQ refuses (max_msgs 1, discard new, already full), invalid
// messages stay in ingress and are redelivered, their dead letters tried again each time. Each message is logged
// at warn once ("dead-lettering invalid message", "dead-letter write refused"), however often it is tried: the
// retries are at debug. docs/guide.md#invalid-input-the-dead-letter-stream: "Each dead letter is logged as a warning".
func TestDeadLetterRefusedLogsOnce(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	logs := &itest.SyncWriter{W: &bytes.Buffer{}}
	b.StartDelayd("1s", func(c *deliver.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	b.SetDLQLimit(1)
	bad := nats.Header{"Delay-Level": []string{"x"}}
	b.Publish("delay.orders.first", []byte("fills the DLQ"), bad)
	itest.WaitFor(t, 20*time.Second, "the first dead letter stored", func() bool { return b.StreamCount(deliver.DLQStream) == 1 })

	const n = 5
	for range n {
		b.Publish("delay.orders.bad", []byte("bad"), bad)
	}
	// Every one of the n is refused several times: at least 4 attempts each on average.
	itest.WaitFor(t, 60*time.Second, "repeated refusals", func() bool { return b.Svc.DLQRefusals().Failures >= 4*n })

	count := func(msg string) int {
		k := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, `msg="`+msg) {
				k++
			}
		}
		return k
	}
	if got := count("dead-lettering invalid message"); got > n+1 {
		t.Errorf("%d warnings \"dead-lettering invalid message\" for %d messages (%d refusals): want one per message\n%s",
			got, n+1, b.Svc.DLQRefusals().Failures, logs)
	}
	if got := count("dead-letter write refused"); got > n {
		t.Errorf("%d warnings \"dead-letter write refused\" for %d messages (%d refusals): want one per message\n%s",
			got, n, b.Svc.DLQRefusals().Failures, logs)
	}
}

// TestDeliveryRetryLogsThrottled: a target stream at its limits (max_msgs 1, discard new, already full) refuses a
// due message, and the scanner retries it. Its first failed attempt and every 10th are logged at warn, the others
// at debug, so 12 or more retries log at most 2 warnings (docs/guarantees.md#failing-targets).
func TestDeliveryRetryLogsThrottled(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	ctx := context.Background()
	if _, err := b.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "FULLLOG", Subjects: []string{"fulllog.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.Publish(ctx, "fulllog.before", []byte("already here")); err != nil {
		t.Fatal(err)
	}
	logs := &itest.SyncWriter{W: &bytes.Buffer{}}
	b.StartDelayd("100ms", func(c *deliver.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	b.Publish("delay.fulllog.x", []byte("refused"), itest.Level(1))
	retries := func() uint64 {
		_, scanners := b.Svc.Stats()
		var n uint64
		for _, s := range scanners {
			n += s.Retries
		}
		return n
	}
	itest.WaitFor(t, 60*time.Second, "12 retries", func() bool { return retries() >= 12 })
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, `msg="delivery failed; retrying"`) {
			n++
		}
	}
	if n < 1 || n > 2 {
		t.Errorf("%d warnings \"delivery failed; retrying\" for %d retries of one message: want 1 or 2\n%s", n, retries(), logs)
	}
}
