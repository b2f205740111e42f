// Package natstest starts real nats-servers for delayd's tests, in the
// style of nats-server's own test harness: loopback, a free port, a
// JetStream store in the test's temp dir, and shutdown at cleanup.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options are the defaults every test server uses: loopback, a free port
// (Port -1), JetStream, no signal handlers, no log.
func Options(storeDir string) *server.Options {
	return &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: storeDir, NoSigs: true, NoLog: true}
}

// Start starts a server with opts (nil: Options(t.TempDir())), waits until
// it accepts connections, and shuts it down when the test ends.
func Start(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts == nil {
		opts = Options(t.TempDir())
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready for connections")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// Connect starts a server with [Options] (as [Start] with nil) and returns
// a connection to it, closed when the test ends, and its JetStream context.
func Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv := Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
