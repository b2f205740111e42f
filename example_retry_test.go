package delayd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/deliver"
)

// ExampleRetry runs a consumer that fails every delivery and hands each one
// back with the next rung of the ladder "100ms 200ms"; after the last rung
// the message is in the dead-letter stream with its history. Against an
// embedded nats-server and a delayd service.
func ExampleRetry() {
	nc, stop := runDelayd("100ms 1s") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()

	// The worker: a durable pull consumer on the target's stream.
	js, _ := jetstream.New(nc)
	stream, _ := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	cons, _ := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "charger", AckPolicy: jetstream.AckExplicitPolicy})
	if _, err := delayd.Publish(ctx, js, "orders.charge", []byte("charge order 42"), delayd.WithLevel(0), delayd.WithMsgID("order-42")); err != nil {
		fmt.Println(err)
		return
	}

	ladder := delayd.MustParseLadder("100ms 200ms")
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("delivery %s, attempt %q: failed\n", msg.Headers().Get("Nats-Msg-Id"), msg.Headers().Get(delayd.HeaderAttempt))
		cause := errors.New("payment gateway timeout") // the work failed
		res, err := delayd.Retry(ctx, js, msg, ladder, cause)
		if err != nil {
			_ = msg.Nak() // delivered again after a while; Retry is deduped
			fmt.Println(err)
			return
		}
		_ = msg.Ack() // the retry (or dead letter) is stored
		if res.DeadLettered {
			fmt.Println("dead-lettered on", res.Subject)
			break
		}
		fmt.Printf("retry %d in %s\n", res.Attempt, res.Delay)
	}

	dlq, _ := js.Stream(ctx, deliver.DLQStream)
	dl, _ := dlq.GetLastMsgForSubject(ctx, "delayd.dlq.retries")
	fmt.Printf("%q, Delay-Error: %s\n", dl.Data, dl.Header.Get(delayd.HeaderError))
	fmt.Println("Delay-Subject:", dl.Header.Get(delayd.HeaderSubject))
	history, _ := delayd.RetryHistory(dl.Header)
	for _, r := range history {
		fmt.Printf("history: attempt %d after %s: %s\n", r.Attempt, r.Delay, r.Cause)
	}
	// Output:
	// delivery order-42, attempt "": failed
	// retry 1 in 100ms
	// delivery order-42-retry1, attempt "1": failed
	// retry 2 in 200ms
	// delivery order-42-retry2, attempt "2": failed
	// dead-lettered on delayd.dlq.retries
	// "charge order 42", Delay-Error: retries exhausted after 3 failed deliveries (the first and 2 retries, ladder 100ms 200ms): payment gateway timeout
	// Delay-Subject: delay.orders.charge
	// history: attempt 1 after 100ms: payment gateway timeout
	// history: attempt 2 after 200ms: payment gateway timeout
}
