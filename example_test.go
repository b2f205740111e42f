package delayd_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
)

// Example publishes a message for delivery after level 1 (100 ms in this
// table) and receives it on the target subject, against an embedded
// nats-server and a delayd service.
func Example() {
	dir, _ := os.MkdirTemp("", "delayd-example-")
	defer os.RemoveAll(dir)
	srv, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	// delayd itself, as cmd/delayd runs it.
	svc, _ := deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("100ms 1s")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for !svc.Ready() {
		time.Sleep(10 * time.Millisecond)
	}

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
