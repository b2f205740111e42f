package delayd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// ExampleCancel schedules two order time-outs, cancels one (the order was
// paid), and shows that only the other is delivered. Cancelling again, or
// an unknown id, gives delayd's other answers.
func ExampleCancel() {
	nc, stop := runDelayd("100ms 1s") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	sub, _ := nc.SubscribeSync("orders.timeout")

	paid, err := delayd.Publish(ctx, js, "orders.timeout", []byte("order 41"), delayd.WithDuration(2*time.Second), delayd.WithMsgID("order-41"))
	if err != nil { // a *DuplicateError too: nothing was stored
		fmt.Println(err)
		return
	}
	unpaid, err := delayd.Publish(ctx, js, "orders.timeout", []byte("order 42"), delayd.WithDuration(2*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{paid, paid, "order-99"} {
		res, err := delayd.Cancel(ctx, nc, "orders.timeout", id)
		fmt.Println("cancel", id+":", res, err)
	}
	m, _ := sub.NextMsg(5 * time.Second)
	fmt.Printf("delivered %q\n", m.Data)
	if res, _ := delayd.Cancel(ctx, nc, "orders.timeout", unpaid); res == delayd.AlreadyDelivered {
		fmt.Println("cancel after delivery:", res)
	}
	if _, err := sub.NextMsg(700 * time.Millisecond); err != nil {
		fmt.Println("nothing else delivered")
	}
	// Output:
	// cancel order-41: cancelled <nil>
	// cancel order-41: cancelled <nil>
	// cancel order-99: not found <nil>
	// delivered "order 42"
	// cancel after delivery: already delivered
	// nothing else delivered
}

// ExamplePublish_reusedID moves a reminder: it cancels the pending message
// and publishes the new one. Publishing it with the cancelled message's id
// stores nothing (the ingress stream dedupes ids for 2 minutes), and
// Publish says so with ErrDuplicate; a new id works.
func ExamplePublish_reusedID() {
	nc, stop := runDelayd("100ms 1s") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()
	js, _ := jetstream.New(nc)

	id, _ := delayd.Publish(ctx, js, "remind.me", []byte("at 10:00"), delayd.WithDuration(time.Hour), delayd.WithMsgID("remind-7"))
	res, _ := delayd.Cancel(ctx, nc, "remind.me", id)
	fmt.Println("cancel", id+":", res)

	_, err := delayd.Publish(ctx, js, "remind.me", []byte("at 11:00"), delayd.WithDuration(2*time.Hour), delayd.WithMsgID("remind-7"))
	var dup *delayd.DuplicateError
	if errors.As(err, &dup) {
		fmt.Printf("publish %s again: nothing stored (ErrDuplicate: %v), window %s\n", dup.ID, errors.Is(err, delayd.ErrDuplicate), dup.Window)
	}
	id, err = delayd.Publish(ctx, js, "remind.me", []byte("at 11:00"), delayd.WithDuration(2*time.Hour), delayd.WithMsgID("remind-7-moved"))
	fmt.Println("published", id, err)
	// Output:
	// cancel remind-7: cancelled
	// publish remind-7 again: nothing stored (ErrDuplicate: true), window 2m0s
	// published remind-7-moved <nil>
}
