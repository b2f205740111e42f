package integration

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestTargetRefusedByServer publishes to ingress subjects that the server
// itself does not store in DELAYD_INGRESS (an empty target, an empty
// token) and to invalid targets it does store (wildcards, a control byte, a
// $ target, a target under delayd.). The first kind never reaches delayd: a
// JetStream publish fails with no response from the stream (nats.go's
// jetstream.ErrNoStreamResponse, the server's no-responders), a core
// publish is dropped without a word, and nothing is dead-lettered. The
// second kind is dead-lettered, as
// docs/guide.md#invalid-input-the-dead-letter-stream says.
func TestTargetRefusedByServer(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 300ms 1s")
	refused := []string{"delay.", "delay.orders..x", "delay..x", "delay.orders."}
	for _, subject := range refused {
		_, err := b.TryPublish(subject, []byte("x"), itest.Level(0))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Errorf("JetStream publish to %q: error %v, want %v", subject, err, jetstream.ErrNoStreamResponse)
		} else {
			t.Logf("JetStream publish to %q: %v", subject, err)
		}
		if err := b.NC.PublishMsg(&nats.Msg{Subject: subject, Data: []byte("x"), Header: itest.Level(0)}); err != nil {
			t.Errorf("core publish to %q: %v, want no error (the server drops it silently)", subject, err)
		}
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	dead := []string{"delay.orders.*", "delay.orders.>", "delay.orders.\x01", "delay.$SYS.x", "delay.delayd.x"}
	for _, subject := range dead {
		b.Publish(subject, []byte("x"), itest.Level(0))
	}
	// A valid message published last routes after everything before it.
	ok := b.Collect("ok.last")
	b.Publish("delay.ok.last", []byte("last"), itest.Level(0))
	ok.Wait(t, 1, 15*time.Second)
	itest.WaitFor(t, 15*time.Second, "dead letters", func() bool { return b.StreamCount(deliver.DLQStream) >= uint64(len(dead)) })
	// Everything the ingress stream stored has been handed on and acked.
	itest.WaitFor(t, 15*time.Second, "an empty ingress stream", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
	msgs := b.StreamMsgs(deliver.DLQStream)
	if len(msgs) != len(dead) {
		for _, m := range msgs {
			t.Logf("dead letter: %s %q", m.Header.Get(contract.HeaderSubject), m.Header.Get(contract.HeaderError))
		}
		t.Fatalf("%d dead letters, want %d (for %q only)", len(msgs), len(dead), dead)
	}
	for i, m := range msgs {
		if got := m.Header.Get(contract.HeaderSubject); got != dead[i] {
			t.Errorf("dead letter %d: %s %q, want %q", i, contract.HeaderSubject, got, dead[i])
		}
	}
}
