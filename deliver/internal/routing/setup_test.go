package routing

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// The router's tests build what a deliver.Service builds for a router (its
// resources, the JetStream context of its writes) here.

// mustJS returns a JetStream context as deliver's mustJS does: a publish-async
// timeout (deliver's publishAsyncTimeout, 10 s), so that every PubAck future
// resolves, and its own async-publish window of maxPending (0: the default).
func mustJS(nc *nats.Conn, maxPending int) jetstream.JetStream {
	opts := []jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(10 * time.Second)}
	if maxPending > 0 {
		opts = append(opts, jetstream.WithPublishAsyncMaxPending(maxPending))
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		panic(err) // only invalid options fail, and these are constant
	}
	return js
}

// serverBundle is an embedded nats-server with a connection to it.
type serverBundle struct {
	t   testing.TB
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func setupServer(t testing.TB) *serverBundle {
	t.Helper()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &serverBundle{t: t, srv: srv, nc: nc, js: js}
}

// publishTo publishes payload for target to the ingress prefix "delay".
func (b *serverBundle) publishTo(target, payload string, h nats.Header) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "delay." + target, Data: []byte(payload), Header: h}); err != nil {
		b.t.Fatalf("publish %s: %v", payload, err)
	}
}

// setupStreams creates every resource of a delayd of table (ingress prefix
// "delay", no partitions, one replica) with [resource.Setup], as a
// deliver.Service's setup does, and returns its hop secret.
func setupStreams(t testing.TB, ctx context.Context, nc *nats.Conn, table levels.Table) hop.Key {
	t.Helper()
	st, err := resource.Setup(ctx, mustJS(nc, 0), resource.Config{
		Prefix: contract.PrefixDefault, Levels: table, IngressPartitions: 1, Replicas: 1,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.HopKey
}
