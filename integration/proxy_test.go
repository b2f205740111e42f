package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestProxy proves the proxy on one nats-server, with a client that knows
// only the proxy: requests pass through it; after cutOff the client is
// disconnected and stays so (it cannot reach the server around the proxy);
// after heal it reconnects by itself and requests pass again; while
// stalled a request gets no answer and the connection stays up, and after
// heal requests pass on the same connection.
func TestProxy(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	echo, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if _, err := echo.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := echo.Flush(); err != nil {
		t.Fatal(err)
	}

	p := itest.StartProxy(t, srv.Addr().String())
	tap := &itest.PubTap{Prefix: "tap."}
	p.TapPubs(tap)
	disconnected, reconnected := make(chan struct{}, 10), make(chan struct{}, 10)
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnected <- struct{}{} }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	request := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		m, err := nc.RequestWithContext(ctx, "echo", []byte("x"))
		if err == nil && string(m.Data) != "x" {
			err = errors.New("wrong answer " + string(m.Data))
		}
		return err
	}
	if err := request(5 * time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	// The tap sees publishes under its prefix, with or without headers,
	// whatever their payload holds.
	hdr := nats.Header{"K": []string{"v"}}
	for _, m := range []*nats.Msg{{Subject: "tap.a", Data: []byte("PUB tap.x 1\r\n")}, {Subject: "other", Data: []byte("y")},
		{Subject: "tap.b", Data: []byte("z"), Header: hdr}} {
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var tapped []string
	for _, tp := range tap.Since(time.Time{}) {
		tapped = append(tapped, tp.Subject)
	}
	if strings.Join(tapped, " ") != "tap.a tap.b" {
		t.Errorf("tapped publishes %q, want tap.a and tap.b", tapped)
	}

	p.CutOff()
	select {
	case <-disconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no disconnect within 10s of the cut")
	}
	// Let time pass: the client retries every 50ms; a way around the proxy
	// would show as a reconnect now.
	time.Sleep(500 * time.Millisecond)
	if nc.IsConnected() {
		t.Fatalf("connected during the cut (to %s)", nc.ConnectedUrl())
	}
	accepted := p.Accepted()
	p.Heal()
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect within 10s of the heal")
	}
	if err := request(5 * time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}
	if p.Accepted() != accepted+1 {
		t.Errorf("the proxy forwarded %d connections after the heal, want 1", p.Accepted()-accepted)
	}

	p.Stall()
	if err := request(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request while stalled: %v, want a timeout", err)
	}
	if !nc.IsConnected() {
		t.Fatal("disconnected by a stall shorter than the ping interval")
	}
	p.Heal()
	if err := request(5 * time.Second); err != nil {
		t.Fatalf("after the stall healed: %v", err)
	}
	if p.Accepted() != accepted+1 {
		t.Errorf("a stall cost a reconnect: %d connections forwarded after the first heal", p.Accepted()-accepted)
	}
}
