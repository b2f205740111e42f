package target

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// routeProxy forwards node i's route connections to node j's cluster port,
// both ways; a way frozen holds every byte sent that way (the sockets stay
// open), as a hung node holds its own.
type routeProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen [2]chan struct{} // by way (0: i to j, 1: j to i): open while frozen; nil while passing
}

func startRouteProxy(t *testing.T, target string) *routeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &routeProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.thaw() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = up.Close() })
			go p.pipe(up, c, 0)
			go p.pipe(c, up, 1)
		}
	}()
	return p
}

// pipe copies from src to dst, holding what it read while way is frozen.
func (p *routeProxy) pipe(dst, src net.Conn, way int) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.frozen[way]
			p.mu.Unlock()
			if frozen != nil {
				<-frozen // closed when the test ends (thaw)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

// thaw lets what a frozen way held go (at the test's end, to sockets
// closed by then).
func (p *routeProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for way, f := range p.frozen {
		if f != nil {
			close(f)
			p.frozen[way] = nil
		}
	}
}

func (p *routeProxy) freeze(way int) {
	p.mu.Lock()
	p.frozen[way] = make(chan struct{})
	p.mu.Unlock()
}

// TestRefreshKeepsUnlistedStream: a target stream whose leader's answers
// do not reach the meta leader (the way from its node to the meta leader's
// hangs; the stream's own group is healthy, so no other peer answers for
// it, and the meta group keeps its leader) is left out of the stream list
// (nats-server's "missing", after 4 s), yet its subjects stay bound after a
// refresh: taken for core subjects, a delivery answered "no responders"
// during an election would count as delivered to no one, and a core
// publish confirmed by a flush would be stored by nobody.
func TestRefreshKeepsUnlistedStream(t *testing.T) {
	// Four nodes; every route passes a proxy; node i has the tags x<k>
	// for every other node k, so that TGT is placed off the meta leader,
	// and n<i>, so that ZZZ is placed on it. ZZZ's name sorts after TGT's:
	// nats.go's stream list then ends without an error and without TGT
	// (the second page, at offset 1 of 2, holds ZZZ again); were TGT the
	// last, the lister would ask for its page until its context ends.
	proxies := map[[2]int]*routeProxy{}
	c := natstest.StartCluster(t, 4, func(i int, o *server.Options) {
		routes := slices.Clone(o.Routes)
		for j, r := range routes {
			if j != i {
				p := startRouteProxy(t, r.Host)
				proxies[[2]int{i, j}] = p
				routes[j] = &url.URL{Scheme: r.Scheme, Host: p.ln.Addr().String()}
			}
			if j != i {
				o.Tags.Add(fmt.Sprintf("x%d", j))
			}
		}
		o.Tags.Add(fmt.Sprintf("n%d", i))
		o.Routes = routes
	})
	meta := c.MetaLeader()
	nc, js := c.Connect(meta)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TGT", Subjects: []string{"tgt.>"}, Replicas: 3,
		Placement: &jetstream.Placement{Tags: []string{fmt.Sprintf("x%d", meta)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ZZZ", Subjects: []string{"zzz.>"},
		Placement: &jetstream.Placement{Tags: []string{fmt.Sprintf("n%d", meta)}}}); err != nil {
		t.Fatal(err)
	}
	leader := c.WaitStreamLeader("TGT")
	b := New(nc, js, nil)
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.Bound("tgt.a") || !b.Bound("zzz.a") {
		t.Fatal("tgt.a or zzz.a not bound with TGT and ZZZ led")
	}
	if c.MetaLeader() != meta || leader == meta {
		t.Fatalf("meta leader node %d (was %d), TGT's leader node %d", c.MetaLeader(), meta, leader)
	}
	proxies[[2]int{leader, meta}].freeze(0) // what the leader's node sends the meta leader's
	proxies[[2]int{meta, leader}].freeze(1)
	// The premise: the stream list leaves TGT out.
	l := js.ListStreams(ctx)
	var listed []string
	for si := range l.Info() {
		listed = append(listed, si.Config.Name)
	}
	if l.Err() != nil || slices.Contains(listed, "TGT") || !slices.Contains(listed, "ZZZ") {
		t.Fatalf("stream list with TGT's leader (node %d) cut off from the meta leader: %v (error %v); want ZZZ without TGT", leader, listed, l.Err())
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.Bound("tgt.b") {
		t.Errorf("tgt.b not bound after a refresh that did not list TGT")
	}
}
