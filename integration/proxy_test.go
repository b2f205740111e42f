package integration

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/natstest"
)

// proxy is a TCP proxy on a free loopback port to one address (a NATS
// node's client port), to put a network fault between a client and the
// server in a test: cut (every connection closed, new ones refused, as a
// peer's reset), stall (nothing forwarded, connections kept open, as a
// network dropping every packet: the client notices only by its pings),
// and heal. A client that must not get around the proxy needs a cluster
// started with [natstest.NoAdvertise].
type proxy struct {
	t      *testing.T
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	cut   bool
	gate  chan struct{} // closed while forwarding; open (blocking) while stalled
	conns map[net.Conn]struct{}
	n     int // connections accepted and forwarded, in all
}

// startProxy starts a proxy to target (host:port) and closes it when the
// test ends.
func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &proxy{t: t, target: target, ln: ln, gate: open, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL returns the proxy's address as a NATS URL, "nats://127.0.0.1:port".
func (p *proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// accepted returns how many connections the proxy has forwarded.
func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// cutOff closes every connection and refuses (accepts and closes at once)
// new ones until heal.
func (p *proxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.openGate() // copiers blocked by a stall find their connections closed
}

// stall stops forwarding in both directions, keeping every connection
// open and accepting new ones, until heal.
func (p *proxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// heal ends a cut or a stall: new connections are forwarded again, and
// stalled ones resume with the bytes they held.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.openGate()
}

// openGate lets stalled copiers go on; p.mu is held.
func (p *proxy) openGate() {
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.cutOff()
	p.wg.Wait()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the listener is closed
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			_ = c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close() // the node is down: the client sees a refused connection, as without the proxy
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.n++
		p.mu.Unlock()
		var once sync.Once
		done := func() {
			once.Do(func() {
				p.mu.Lock()
				delete(p.conns, c)
				delete(p.conns, up)
				p.mu.Unlock()
				_ = c.Close()
				_ = up.Close()
			})
		}
		p.wg.Go(func() { p.copy(up, c); done() })
		p.wg.Go(func() { p.copy(c, up); done() })
	}
}

// copy forwards src to dst until either fails, holding each chunk read
// while the proxy is stalled.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

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

	p := startProxy(t, srv.Addr().String())
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

	p.cutOff()
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
	accepted := p.accepted()
	p.heal()
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect within 10s of the heal")
	}
	if err := request(5 * time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}
	if p.accepted() != accepted+1 {
		t.Errorf("the proxy forwarded %d connections after the heal, want 1", p.accepted()-accepted)
	}

	p.stall()
	if err := request(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request while stalled: %v, want a timeout", err)
	}
	if !nc.IsConnected() {
		t.Fatal("disconnected by a stall shorter than the ping interval")
	}
	p.heal()
	if err := request(5 * time.Second); err != nil {
		t.Fatalf("after the stall healed: %v", err)
	}
	if p.accepted() != accepted+1 {
		t.Errorf("a stall cost a reconnect: %d connections forwarded after the first heal", p.accepted()-accepted)
	}
}
