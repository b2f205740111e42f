package delayd_test

import (
	"context"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
)

// runDelayd starts what the examples run against: an embedded nats-server
// with JetStream in a temp dir, and delayd itself, as cmd/delayd runs it,
// with the level table. It returns a connection and a stop function.
func runDelayd(table string) (*nats.Conn, func()) {
	dir, _ := os.MkdirTemp("", "delayd-example-")
	srv, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(srv.ClientURL())
	// As the end-to-end tests' harness (integration/internal/itest): one
	// delayd, so a lease TTL that CPU starvation cannot expire, and cancel
	// lookups unpaced (the examples show answers, not pacing; paced to a
	// tenth of a core by wall time, a lone cancel beside a CPU hog was
	// answered busy).
	svc, _ := deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse(table), LeaseTTL: 15 * time.Second, CancelLookupShare: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	for !svc.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	return nc, func() {
		cancel()
		<-done
		nc.Close()
		srv.Shutdown()
		os.RemoveAll(dir)
	}
}
