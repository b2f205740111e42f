package delayd_test

import (
	"context"
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

	paid, _ := delayd.Publish(ctx, js, "orders.timeout", []byte("order 41"), delayd.WithDuration(500*time.Millisecond), delayd.WithMsgID("order-41"))
	unpaid, _ := delayd.Publish(ctx, js, "orders.timeout", []byte("order 42"), delayd.WithDuration(500*time.Millisecond))
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
