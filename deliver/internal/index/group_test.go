package index

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

// TestGroupAnswerLost: the first copy of a group's one slot message is
// stored and its PubAck lost (LoseAnswers), as when the index stream's
// leader hangs. The message is sent again after jswire.WriteAttempt and
// Stored reports it stored, where it used to fail with the publish-async
// timeout; the stream then holds both copies, and a lookup finds the
// record. The js context's publish-async timeout is the service's (10 s).
func TestGroupAnswerLost(t *testing.T) {
	t.Parallel()
	nc, _ := natstest.Connect(t)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(jswire.OpTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	want := Record{Key: UserKey("order-7"), Stream: "DELAYD_1S", Seq: 3, Due: time.Unix(0, 42), Target: "orders.close"}
	g := NewGroup()
	var copies atomic.Int64
	g.LoseAnswers(func() bool { return copies.Add(1) == 1 })
	g.Add(want)
	g.Flush(js)
	if err := g.Stored(); err != nil {
		t.Fatalf("Stored: %v, want the record stored (its unanswered copy sent again)", err)
	}
	if n := copies.Load(); n < 2 {
		t.Fatalf("%d copies sent, want the first lost and a second: this run does not test a lost answer", n)
	}
	if n := streamMsgs(t, js); n != 2 {
		t.Errorf("%d index messages, want 2 (the lost copy, stored, and the one answered)", n)
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	got, ok, err := Lookup(ctx, reader, want.Key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want.At = got.At
	if !ok || !sameRecord(got, want) {
		t.Errorf("Lookup(%q) = %+v, %v; want %+v", want.Key, got, ok, want)
	}
}
