package integration

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// Tests of claims in docs/ that no other test checks.

// TestConsumerRecreated: docs/guarantees.md#backlogs-cost-no-memory: if the server
// drops a scanner's consumer while its level waits for its head, the
// scanner recreates it where it stands, and the head is delivered.
func TestConsumerRecreated(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 3s")
	c := b.Collect("drop.x")
	b.Publish("delay.drop.x", []byte("head"), itest.Level(2))
	ctx := context.Background()
	const consumer = "delayd-scan-DELAYD_3S"
	s, err := b.JS.Stream(ctx, "DELAYD_3S")
	if err != nil {
		t.Fatal(err)
	}
	// The scanner has read the head and waits for its due time.
	itest.WaitFor(t, 10*time.Second, "the scanner waiting for its head", func() bool {
		return b.ScannerStats("DELAYD_3S").Pending == 1 && consumerExists(s, consumer)
	})
	if err := s.DeleteConsumer(ctx, consumer); err != nil {
		t.Fatal(err)
	}
	got := c.Wait(t, 1, 15*time.Second)
	if string(got[0].Msg.Data) != "head" {
		t.Errorf("delivered %q, want head", got[0].Msg.Data)
	}
	// Later traffic still flows through a new consumer.
	b.Publish("delay.drop.x", []byte("after"), itest.Level(2))
	got = c.Wait(t, 2, 15*time.Second)
	if string(got[1].Msg.Data) != "after" {
		t.Errorf("delivered %q, want after", got[1].Msg.Data)
	}
	itest.WaitFor(t, 10*time.Second, "the consumer recreated", func() bool { return consumerExists(s, consumer) })
}

func consumerExists(s jetstream.Stream, name string) bool {
	_, err := s.Consumer(context.Background(), name)
	return err == nil || !errors.Is(err, jetstream.ErrConsumerNotFound)
}

// TestMergeKeyPerTarget: docs/guide.md#merge-delay-merge-key: a merge key coalesces messages
// with the same key and target only; the same key bound for two targets
// gives two deliveries.
func TestMergeKeyPerTarget(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("500ms")
	rec := itest.NewRecorder(t)
	rec.Subscribe(b.NC, "mkt.>")
	for _, target := range []string{"mkt.a", "mkt.b", "mkt.a"} {
		hdr := itest.Level(1)
		hdr.Set(contract.HeaderMergeKey, "k")
		b.Publish("delay."+target, []byte(target), hdr)
	}
	rec.ExpectKeys("mkt.a", "mkt.b")
	itest.WaitFor(t, 10*time.Second, "3 messages routed or merged", func() bool { rs, _ := b.Svc.Stats(); return rs.Routed+rs.Merged == 3 })
	rs, _ := b.Svc.Stats()
	itest.WaitFor(t, 10*time.Second, "DELAYD_500MS offset past its messages", func() bool { return b.ScannerStats("DELAYD_500MS").Offset >= rs.Routed })
	// The offset passes on the flush round trip; the subscription's callback
	// may still be on its way.
	itest.WaitFor(t, 10*time.Second, "2 deliveries received", func() bool { return len(rec.Snapshot()) >= 2 })
	rec.CheckAll()
	if rs, _ := b.Svc.Stats(); rs.Merged != 1 || rs.Routed != 2 {
		t.Errorf("merged %d, routed %d; want 1 and 2 (the key is per target)", rs.Merged, rs.Routed)
	}
}

// TestUndeliverableAfterMaxAttempts: docs/guarantees.md#failing-targets: a delivery
// a target refuses for good is dead-lettered after 3 attempts: three
// publishes to the target, each counted as a failed delivery, then the
// dead letter.
func TestUndeliverableAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	if _, err := b.JS.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "TINY", Subjects: []string{"tiny.>"}, MaxMsgSize: 10, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	b.StartDelayd("100ms")
	var attempts atomic.Int64
	sub, err := b.NC.Subscribe("tiny.big", func(*nats.Msg) { attempts.Add(1) }) // every publish delayd makes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	b.Publish("delay.tiny.big", make([]byte, 100), itest.Level(1))
	itest.WaitFor(t, 30*time.Second, "the dead letter", func() bool { return b.StreamCount(deliver.DLQStream) == 1 })
	// Counted once the dead letter's PubAck is back, which may trail its
	// arrival in DELAYD_DLQ.
	itest.WaitFor(t, 10*time.Second, "the dead letter counted", func() bool { return b.ScannerStats("DELAYD_100MS").DeadLettered >= 1 })
	st := b.ScannerStats("DELAYD_100MS")
	if st.Retries != deliver.ScannerMaxAttemptsDefault || st.DeadLettered != 1 {
		t.Errorf("failed deliveries %d, dead-lettered %d; want %d and 1", st.Retries, st.DeadLettered, deliver.ScannerMaxAttemptsDefault)
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := attempts.Load(); n != 3 || deliver.ScannerMaxAttemptsDefault != 3 {
		t.Errorf("%d publishes to the target (max attempts %d), want 3 as README says", n, deliver.ScannerMaxAttemptsDefault)
	}
}
