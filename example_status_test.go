package delayd_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// ExampleStatus asks about a reminder without cancelling it: pending, with
// the time it is due; then, once the subscriber got it, already delivered,
// also by the Nats-Msg-Id the subscriber received.
func ExampleStatus() {
	nc, stop := runDelayd("100ms 1s") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	sub, _ := nc.SubscribeSync("remind.me")

	at := time.Now().Add(2500 * time.Millisecond).Truncate(time.Second)
	id, err := delayd.Publish(ctx, js, "remind.me", []byte("stand-up"), delayd.WithDeliverAt(at))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := delayd.Status(ctx, nc, "remind.me", id)
	fmt.Println(res.State, res.DueAt.Equal(at), err)
	res, _ = delayd.Status(ctx, nc, "other.subject", id)
	fmt.Println("in another target's scope:", res.State)

	m, _ := sub.NextMsg(5 * time.Second)
	res, _ = delayd.Status(ctx, nc, "remind.me", id)
	fmt.Println("after delivery:", res.State)
	res, _ = delayd.Status(ctx, nc, "remind.me", m.Header.Get("Nats-Msg-Id"))
	fmt.Println("by the delivered Nats-Msg-Id:", res.State)
	// Output:
	// pending true <nil>
	// in another target's scope: not found
	// after delivery: already delivered
	// by the delivered Nats-Msg-Id: already delivered
}
