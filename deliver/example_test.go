package deliver_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
)

// ExampleService embeds delayd in a Go program: a [deliver.Service] on a
// connection to a JetStream-enabled server (here an embedded nats-server in
// a temp dir), run until its context is done. A message published to
// "delay.<target>" with a Delay-Level header arrives on the target after the
// level's delay; Run returns nil once the context is cancelled, after it has
// committed every level's offset.
func ExampleService() {
	dir, _ := os.MkdirTemp("", "delayd-example-service-")
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Println("nats-server not ready")
		return
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	svc, err := deliver.New(nc, deliver.Config{Levels: levels.MustParse("200ms 1s")})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	for !svc.Ready() { // Ready is what /readyz answers in cmd/delayd
		time.Sleep(10 * time.Millisecond)
	}

	sub, _ := nc.SubscribeSync("reminders.meeting")
	msg := nats.NewMsg("delay.reminders.meeting")
	msg.Header.Set("Delay-Level", "1")
	msg.Data = []byte("stand-up in 5 minutes")
	if _, err := nc.RequestMsg(msg, 5*time.Second); err != nil { // the ingress stream's PubAck
		fmt.Println(err)
		return
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	due, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Delay-Due-At"))
	enqueued, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Delay-Enqueued-At"))
	fmt.Printf("%q on %s, due %s after it was stored\n", m.Data, m.Subject, due.Sub(enqueued))

	stop()
	fmt.Println("Run returned", <-done)
	// Output:
	// "stand-up in 5 minutes" on reminders.meeting, due 200ms after it was stored
	// Run returned <nil>
}
