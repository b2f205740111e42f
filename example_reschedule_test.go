package delayd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// ExampleReschedule moves a reminder: the meeting moved, so its reminder,
// due in an hour, goes out in a second instead. It keeps its id and
// payload, and its delivery says it was rescheduled once and carries the
// due the answer gave. Once delivered, it cannot be moved again; an
// unknown id is not found.
func ExampleReschedule() {
	nc, stop := runDelayd("100ms 1s 1h") // an embedded nats-server and delayd
	defer stop()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	sub, _ := nc.SubscribeSync("orders.remind")

	id, err := delayd.Publish(ctx, js, "orders.remind", []byte("meeting at 9"), delayd.WithDuration(time.Hour), delayd.WithMsgID("remind-42"))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := delayd.Reschedule(ctx, nc, "orders.remind", id, delayd.In(time.Second))
	fmt.Println("reschedule", id+":", res.Result, err)

	m, _ := sub.NextMsg(10 * time.Second)
	due, _ := time.Parse(time.RFC3339Nano, m.Header.Get(delayd.HeaderDueAt))
	fmt.Printf("delivered %q, id %s, rescheduled %s time(s), at the new due: %t\n",
		m.Data, m.Header.Get("Nats-Msg-Id"), m.Header.Get(delayd.HeaderRescheduled), due.Equal(res.DueAt))

	res, _ = delayd.Reschedule(ctx, nc, "orders.remind", id, delayd.Now())
	fmt.Println("reschedule after delivery:", res.Result)
	res, _ = delayd.Reschedule(ctx, nc, "orders.remind", "remind-99", delayd.Now())
	fmt.Println("reschedule remind-99:", res.Result, errors.Is(res.Err(), delayd.ErrNotFound))
	// Output:
	// reschedule remind-42: rescheduled <nil>
	// delivered "meeting at 9", id remind-42, rescheduled 1 time(s), at the new due: true
	// reschedule after delivery: already delivered
	// reschedule remind-99: not found true
}
