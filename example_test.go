package delayd_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// Example publishes a message for delivery after level 1 (100 ms in this
// table) and receives it on the target subject, against an embedded
// nats-server and a delayd service.
func Example() {
	nc, stop := runDelayd("100ms 1s") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()

	sub, _ := nc.SubscribeSync("orders.close")
	js, _ := jetstream.New(nc)
	id, err := delayd.Publish(ctx, js, "orders.close", []byte("close order 42"), delayd.WithLevel(1), delayd.WithMsgID("order-42"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("published, id", id)

	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(delayd.HeaderDueAt))
	enq, _ := time.Parse(time.RFC3339Nano, m.Header.Get(delayd.HeaderEnqueuedAt))
	fmt.Printf("received %q on %s, due %s after enqueue, Nats-Msg-Id %s\n", m.Data, m.Subject, due.Sub(enq), m.Header.Get("Nats-Msg-Id"))
	// Output:
	// published, id order-42
	// received "close order 42" on orders.close, due 100ms after enqueue, Nats-Msg-Id order-42
}

// ExamplePublish_invalidTarget shows that Publish refuses, at once, what
// delayd would dead-letter.
func ExamplePublish_invalidTarget() {
	_, err := delayd.Publish(context.Background(), nil, "$JS.API.STREAM.DELETE.ORDERS", nil, delayd.WithLevel(1))
	fmt.Println(err)
	// Output:
	// delayd: forbidden target subject: "$JS.API.STREAM.DELETE.ORDERS": subjects starting with '$' are NATS APIs
}
