package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestRetryLadder runs a consumer that fails every delivery and hands it
// back with delayd.Retry along the ladder "200ms 500ms 1s" (delayd levels
// "100ms 300ms 1s", so the 200ms and 500ms rungs cascade). Each retry must
// wait exactly its rung from its ingress store time and arrive no earlier,
// so never earlier than the previous delivery plus the rung; the attempt
// counts 1..3; a consumer that calls Retry twice for one attempt (a crash
// before its ack) gets one retry; after the last rung exactly one dead
// letter holds the payload and the three-record history.
func TestRetryLadder(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	stream := b.CreateStream("LADDER", "ladder.>")
	b.StartDelayd("100ms 300ms 1s")
	ctx := context.Background()
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	ladder := delayd.MustParseLadder("200ms 500ms 1s")
	payload := []byte("work item 7")
	if _, err := delayd.Publish(ctx, b.JS, "ladder.work", payload, delayd.WithLevel(0), delayd.WithMsgID("item-7")); err != nil {
		t.Fatal(err)
	}

	var prevArrival time.Time // the previous delivery's store time in LADDER (server clock)
	for n := 0; ; n++ {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d: %v", n, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		arrival := meta.Timestamp
		h := msg.Headers()
		if got, want := h.Get(delayd.HeaderAttempt), map[bool]string{true: "", false: fmt.Sprint(n)}[n == 0]; got != want {
			t.Errorf("delivery %d: Delay-Attempt %q, want %q", n, got, want)
		}
		if string(msg.Data()) != string(payload) {
			t.Errorf("delivery %d: payload %q, want %q", n, msg.Data(), payload)
		}
		if n > 0 {
			rung := ladder[n-1]
			enq := parseTime(t, h, delayd.HeaderEnqueuedAt)
			due := parseTime(t, h, delayd.HeaderDueAt)
			if due.Sub(enq) != rung {
				t.Errorf("retry %d: Delay-Due-At − Delay-Enqueued-At = %s, want the rung %s", n, due.Sub(enq), rung)
			}
			if arrival.Before(due) {
				t.Errorf("retry %d arrived %s early", n, due.Sub(arrival))
			}
			if enq.Before(prevArrival) {
				t.Errorf("retry %d enqueued %s before the delivery it retries arrived", n, prevArrival.Sub(enq))
			}
			if want := fmt.Sprintf("item-7-retry%d", n); h.Get("Nats-Msg-Id") != want {
				t.Errorf("retry %d: Nats-Msg-Id %q, want %q", n, h.Get("Nats-Msg-Id"), want)
			}
			hist, err := delayd.RetryHistory(h)
			if err != nil || len(hist) != n {
				t.Errorf("retry %d: history %+v, %v; want %d records", n, hist, err, n)
			}
			t.Logf("retry %d: rung %s, hops %q, arrived %s after the previous delivery, late %s", n, rung, h.Get(delayd.HeaderHops),
				arrival.Sub(prevArrival), arrival.Sub(due))
		}
		prevArrival = arrival

		cause := fmt.Errorf("attempt %d: downstream refused", n)
		res, err := delayd.Retry(ctx, b.JS, msg, ladder, cause)
		if err != nil {
			t.Fatalf("delivery %d: Retry: %v", n, err)
		}
		if n == 1 { // the consumer crashed before its ack and got the message again
			again, err := delayd.Retry(ctx, b.JS, msg, ladder, cause)
			if err != nil || !again.Duplicate || again.Sequence != res.Sequence {
				t.Errorf("Retry twice for attempt 2: %+v, %v; want a duplicate of %+v", again, err, res)
			}
		}
		if err := msg.Ack(); err != nil {
			t.Fatal(err)
		}
		if n == len(ladder) {
			if !res.DeadLettered || res.Attempt != len(ladder) || res.Subject != "delayd.dlq.retries" {
				t.Fatalf("after the last rung: %+v, want dead-lettered after %d attempts", res, len(ladder))
			}
			break
		}
		if res.DeadLettered || res.Attempt != n+1 || res.Delay != ladder[n] {
			t.Fatalf("delivery %d: %+v, want attempt %d with delay %s", n, res, n+1, ladder[n])
		}
	}

	// Nothing more arrives: one delivery per attempt, duplicates dropped.
	if msg, err := cons.Next(jetstream.FetchMaxWait(1500 * time.Millisecond)); err == nil {
		t.Errorf("after the dead letter: delivery %v with %v; want no more", msg.Headers().Get("Nats-Msg-Id"), msg.Headers())
	}
	if n := b.StreamCount("LADDER"); n != uint64(len(ladder)+1) {
		t.Errorf("LADDER holds %d deliveries, want %d", n, len(ladder)+1)
	}
	dls := b.StreamMsgs(deliver.DLQStream)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if dl.Subject != "delayd.dlq.retries" || string(dl.Data) != string(payload) {
		t.Errorf("dead letter on %s with %q, want delayd.dlq.retries with the payload", dl.Subject, dl.Data)
	}
	if e := dl.Header.Get(delayd.HeaderError); !strings.HasPrefix(e, "retries exhausted after 4 failed deliveries (the first and 3 retries, ladder ") || !strings.HasSuffix(e, "attempt 3: downstream refused") {
		t.Errorf("Delay-Error %q", e)
	}
	if s, id := dl.Header.Get(delayd.HeaderSubject), dl.Header.Get(delayd.HeaderMsgID); s != "delay.ladder.work" || id != "item-7-retry3" {
		t.Errorf("Delay-Subject %q, Delay-Msg-Id %q; want delay.ladder.work, item-7-retry3", s, id)
	}
	hist, err := delayd.RetryHistory(dl.Header)
	if err != nil || len(hist) != len(ladder) {
		t.Fatalf("history %+v, %v; want %d records", hist, err, len(ladder))
	}
	for i, r := range hist {
		if r.Attempt != i+1 || r.Delay != ladder[i] || r.Cause != fmt.Sprintf("attempt %d: downstream refused", i) {
			t.Errorf("history record %d: %+v", i, r)
		}
	}
}
