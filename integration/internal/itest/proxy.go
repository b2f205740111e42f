package itest

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port to one address (a NATS
// node's client port), to put a network fault between a client and the
// server in a test: cut (every connection closed, new ones refused, as a
// peer's reset), stall (nothing forwarded, connections kept open, as a
// network dropping every packet: the client notices only by its pings),
// and heal. A client that must not get around the proxy needs a cluster
// started with [natstest.NoAdvertise].
type Proxy struct {
	t      *testing.T
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	cut   bool
	gate  chan struct{} // closed while forwarding; open (blocking) while stalled
	conns map[net.Conn]struct{}
	n     int // connections accepted and forwarded, in all
	tap   *PubTap
}

// StartProxy starts a proxy to target (host:port) and closes it when the
// test ends.
func StartProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{t: t, target: target, ln: ln, gate: open, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// URL returns the proxy's address as a NATS URL, "nats://127.0.0.1:port".
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Accepted returns how many connections the proxy has forwarded.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// CutOff closes every connection and refuses (accepts and closes at once)
// new ones until heal.
func (p *Proxy) CutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.openGate() // copiers blocked by a stall find their connections closed
}

// Stall stops forwarding in both directions, keeping every connection
// open and accepting new ones, until heal.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// Heal ends a cut or a stall: new connections are forwarded again, and
// stalled ones resume with the bytes they held.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.openGate()
}

// openGate lets stalled copiers go on; p.mu is held.
func (p *Proxy) openGate() {
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.CutOff()
	p.wg.Wait()
}

func (p *Proxy) accept() {
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
func (p *Proxy) copy(dst, src net.Conn, seen func([]byte)) {
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

// TapPubs makes the proxy record every PUB and HPUB a client sends through
// it (on connections accepted from now on) to a subject starting with
// prefix: which subject, and when the proxy read it. Set it before the
// client connects.
func (p *Proxy) TapPubs(tap *PubTap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tap = tap
}

// PubTap is what proxies' tapPubs recorded: the publishes one client sent
// to subjects under prefix. Safe for concurrent use.
type PubTap struct {
	Prefix string
	mu     sync.Mutex
	pubs   []TappedPub
}

// TappedPub is one publish a proxy forwarded.
type TappedPub struct {
	Subject string
	At      time.Time // when the proxy read it
}

// Since returns the publishes read at or after t.
func (tp *PubTap) Since(t time.Time) []TappedPub {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []TappedPub
	for _, p := range tp.pubs {
		if !p.At.Before(t) {
			out = append(out, p)
		}
	}
	return out
}

// pubParser reads one connection's client-to-server NATS protocol (one
// command a line; PUB and HPUB followed by a payload of the size the line
// ends with) and records the publishes under the tap's prefix.
type pubParser struct {
	tap  *PubTap
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
		if strings.HasPrefix(f[1], pp.tap.Prefix) {
			pp.tap.mu.Lock()
			pp.tap.pubs = append(pp.tap.pubs, TappedPub{Subject: f[1], At: at})
			pp.tap.mu.Unlock()
		}
	}
}
