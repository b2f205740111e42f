package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
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
	tap   *pubTap
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
		var seen func([]byte)
		if p.tap != nil {
			seen = (&pubParser{tap: p.tap}).feed
		}
		p.wg.Go(func() { p.copy(up, c, seen); done() })
		p.wg.Go(func() { p.copy(c, up, nil); done() })
	}
}

// copy forwards src to dst until either fails, holding each chunk read
// while the proxy is stalled. seen, if not nil, gets each chunk as read.
func (p *proxy) copy(dst, src net.Conn, seen func([]byte)) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && seen != nil {
			seen(buf[:n])
		}
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

// tapPubs makes the proxy record every PUB and HPUB a client sends through
// it (on connections accepted from now on) to a subject starting with
// prefix: which subject, and when the proxy read it. Set it before the
// client connects.
func (p *proxy) tapPubs(tap *pubTap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tap = tap
}

// pubTap is what proxies' tapPubs recorded: the publishes one client sent
// to subjects under prefix. Safe for concurrent use.
type pubTap struct {
	prefix string
	mu     sync.Mutex
	pubs   []tappedPub
}

// tappedPub is one publish a proxy forwarded.
type tappedPub struct {
	subject string
	at      time.Time // when the proxy read it
}

// since returns the publishes read at or after t.
func (tp *pubTap) since(t time.Time) []tappedPub {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []tappedPub
	for _, p := range tp.pubs {
		if !p.at.Before(t) {
			out = append(out, p)
		}
	}
	return out
}

// pubParser reads one connection's client-to-server NATS protocol (one
// command a line; PUB and HPUB followed by a payload of the size the line
// ends with) and records the publishes under the tap's prefix.
type pubParser struct {
	tap  *pubTap
	buf  []byte
	skip int // payload bytes (and their CRLF) still to pass over
}

func (pp *pubParser) feed(b []byte) {
	at := time.Now()
	pp.buf = append(pp.buf, b...)
	for {
		if pp.skip > 0 {
			n := min(pp.skip, len(pp.buf))
			pp.buf, pp.skip = pp.buf[n:], pp.skip-n
			if pp.skip > 0 {
				return
			}
		}
		i := bytes.Index(pp.buf, []byte("\r\n"))
		if i < 0 {
			return
		}
		f := strings.Fields(string(pp.buf[:i]))
		pp.buf = pp.buf[i+2:]
		if len(f) < 3 {
			continue // PING, PONG, CONNECT, SUB, UNSUB: no payload
		}
		op := strings.ToUpper(f[0])
		if op != "PUB" && op != "HPUB" {
			continue
		}
		size, err := strconv.Atoi(f[len(f)-1]) // PUB's size, HPUB's total size
		if err != nil {
			continue
		}
		pp.skip = size + 2
		if strings.HasPrefix(f[1], pp.tap.prefix) {
			pp.tap.mu.Lock()
			pp.tap.pubs = append(pp.tap.pubs, tappedPub{subject: f[1], at: at})
			pp.tap.mu.Unlock()
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
	tap := &pubTap{prefix: "tap."}
	p.tapPubs(tap)
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
	for _, tp := range tap.since(time.Time{}) {
		tapped = append(tapped, tp.subject)
	}
	if strings.Join(tapped, " ") != "tap.a tap.b" {
		t.Errorf("tapped publishes %q, want tap.a and tap.b", tapped)
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
