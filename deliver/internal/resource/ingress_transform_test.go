package resource

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// TestIngressTransformServer checks what ingress partitioning relies on in
// nats-server: a work-queue stream on "<prefix>.>" takes a subject
// transform to "delayd.in.{{partition(n)}}.>", stores each message under
// its partition, answers the publisher's PubAck, still drops a repeated
// Nats-Msg-Id, and serves a consumer filtered on one partition.
func TestIngressTransformServer(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.StreamConfig{
		Name: IngressStream, Subjects: []string{"delay.>"}, Retention: jetstream.WorkQueuePolicy,
		SubjectTransform: IngressTransform("delay", 4),
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		t.Fatalf("create ingress stream with transform: %v", err)
	}
	ack, err := js.Publish(ctx, "delay.orders.close", []byte("a"), jetstream.WithMsgID("id-1"))
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ack.Duplicate {
		t.Fatal("first publish reported duplicate")
	}
	dup, err := js.Publish(ctx, "delay.orders.close", []byte("a"), jetstream.WithMsgID("id-1"))
	if err != nil || !dup.Duplicate {
		t.Fatalf("repeated Nats-Msg-Id: ack %+v err %v, want a duplicate", dup, err)
	}
	m, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	want := IngressPartitionSubject(IngressPartitionOf("delay.orders.close", 4)) + "orders.close"
	if m.Subject != want {
		t.Fatalf("stored subject %q, want %q", m.Subject, want)
	}
	if m.Subject != "delayd.in.1.orders.close" {
		t.Fatalf("stored subject %q, want delayd.in.1.orders.close (the server's partition())", m.Subject)
	}
	// The server's partition() agrees with IngressPartitionOf for every
	// subject, not only the one above (a hash that differs may still give
	// one subject the same partition).
	seen := make(map[int]bool)
	for i := range 32 {
		target := "t" + strconv.Itoa(i) + ".x"
		ack, err := js.Publish(ctx, "delay."+target, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		p := IngressPartitionOf("delay."+target, 4)
		seen[p] = true
		if want := IngressPartitionSubject(p) + target; m.Subject != want {
			t.Errorf("delay.%s stored as %q, want %q", target, m.Subject, want)
		}
	}
	if len(seen) != 4 {
		t.Errorf("32 subjects fell in %d of 4 partitions", len(seen))
	}
	// One consumer per partition: non-overlapping filters on a work queue.
	for i := range 4 {
		if _, err := js.CreateOrUpdateConsumer(ctx, IngressStream, jetstream.ConsumerConfig{
			Durable: "p" + string(rune('0'+i)), FilterSubject: IngressPartitionSubject(i) + ">", AckPolicy: jetstream.AckExplicitPolicy,
		}); err != nil {
			t.Fatalf("consumer on partition %d: %v", i, err)
		}
	}
	c, err := js.Consumer(ctx, IngressStream, "p1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("partition 1's consumer: %v", err)
	}
	if got.Subject() != "delayd.in.1.orders.close" {
		t.Fatalf("partition 1's consumer got %q", got.Subject())
	}
}
