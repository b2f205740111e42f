//go:build gray

package routing

import (
	"bytes"
	"context"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestStaleRouterPipelinedWrites: the hole of
// docs/design.md#re-sent-writes-to-a-hung-leader ("Open, and older than
// this change"), behind the tag gray until it is closed: it fails today.
// Router A (term 5) writes m1 and m2 to a level stream, pipelined
// (expecting T and T+1), and both are held in its connection's socket (a
// proxy stops forwarding A's bytes from its first level write on: a node
// that hangs). Router B (term 6) takes over, writes its epoch marker at T
// (stored as T+1) and writes m1 and m2 itself, held the same way. A's
// bytes go through first: m1, expecting T, is refused; m2, expecting T+1,
// the marker's sequence, is stored. Then B's: both refused; B's resync
// finds m2 as the level's last router write and takes m1 for stored too.
// The level stream must hold m1 and m2 once each; today B's m2, expecting
// the place A's m2 took, is stored too: it holds marker 5, marker 6, m2,
// m2 (m1 lost, m2 doubled).
func TestStaleRouterPipelinedWrites(t *testing.T) {
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	table := levels.MustParse("1h")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, nc, table)
	level, _ := table.Level(1)
	stream := level.Stream()
	trigger := []byte(contract.LevelSubjectPrefix + level.Name() + ".orders.close")
	startRouter := func(epoch uint64) (*holdProxy, func()) {
		p := newHoldProxy(t, srv.Addr().String(), trigger)
		rnc, err := nats.Connect("nats://"+p.ln.Addr().String(), nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rnc.Close)
		r, err := New(mustJS(rnc, 0), Config{Prefix: "delay", Levels: table},
			Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret})
		if err != nil {
			t.Fatal(err)
		}
		r.hooks.ackTimeout = time.Minute // neither router resyncs while its bytes are held
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.RunTerm(rctx, ownership.Term{Epoch: epoch}) }()
		return p, func() { stop(); p.release(); rnc.Close(); <-done }
	}
	js, _ := jetstream.New(nc)
	payloads := [][]byte{[]byte("payload-one"), []byte("payload-two")}

	pa, stopA := startRouter(5)
	defer stopA()
	waitConsumer(t, ctx, js, RouterConsumerName(5))
	for _, p := range payloads {
		m := &nats.Msg{Subject: "delay.orders.close", Data: p, Header: nats.Header{contract.HeaderLevel: {"1"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	pa.waitHeld(t, payloads)
	t.Log("router A (term 5) sent m1 and m2; both held")

	pb, stopB := startRouter(6)
	defer stopB()
	pb.waitHeld(t, payloads)
	t.Log("router B (term 6) wrote its marker, sent m1 and m2; both held")

	pa.release()
	time.Sleep(500 * time.Millisecond) // A's copies reach the server first
	pb.release()
	t.Log("released A's bytes, then B's")

	reader, err := jswire.NewBatchReader(nc, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var got []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		in, err := js.Stream(ctx, resource.IngressStream)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := reader.Read(ctx, stream, nil, 1, 16, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, m := range msgs {
			if isMarkerMsg(m) {
				got = append(got, "marker "+m.Header.Get(message.HdrRouterEpoch))
			} else {
				got = append(got, string(m.Data))
			}
		}
		if in.CachedInfo().State.Msgs == 0 || time.Now().After(deadline) {
			break
		}
	}
	want := []string{"marker 5", "marker 6", "payload-one", "payload-two"}
	if !slices.Equal(got, want) {
		t.Fatalf("level stream %s holds %q; want %q: each message once, in order", stream, got, want)
	}
}

// waitConsumer waits until the ingress consumer name exists with a pull
// waiting.
func waitConsumer(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := js.Consumer(ctx, resource.IngressStream, name)
		if err == nil && c.CachedInfo().NumWaiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s with a waiting pull: %v", name, err)
		}
	}
}

// holdProxy forwards one client connection to a server, and stops
// forwarding the client's bytes from the first read that holds trigger on
// (a node that hangs: they wait in its socket) until release.
type holdProxy struct {
	ln      net.Listener
	target  string
	trigger []byte

	mu      sync.Mutex
	holding bool
	done    bool // released: forward everything
	held    []byte
	server  net.Conn
}

func newHoldProxy(t *testing.T, target string, trigger []byte) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln, target: target, trigger: trigger}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			return
		}
		t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
		p.mu.Lock()
		p.server = s
		p.mu.Unlock()
		go func() { _, _ = io.Copy(c, s) }()
		buf := make([]byte, 64<<10)
		var tail []byte // the last bytes read, for a trigger split across reads
		for {
			n, err := c.Read(buf)
			if n > 0 {
				chunk := buf[:n]
				p.mu.Lock()
				seen := append(slices.Clone(tail), chunk...)
				if !p.done && !p.holding && bytes.Contains(seen, p.trigger) {
					p.holding = true
				}
				if p.holding {
					p.held = append(p.held, chunk...)
				} else if _, werr := s.Write(chunk); werr != nil {
					p.mu.Unlock()
					return
				}
				p.mu.Unlock()
				tail = seen[max(0, len(seen)-len(p.trigger)):]
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

// waitHeld waits until the held bytes hold every one of want.
func (p *holdProxy) waitHeld(t *testing.T, want [][]byte) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		p.mu.Lock()
		ok := p.holding
		for _, w := range want {
			ok = ok && bytes.Contains(p.held, w)
		}
		p.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("held bytes never held %q", want)
		}
	}
}

// release forwards the held bytes, in order, and everything after them.
func (p *holdProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done, p.holding = true, false
	if p.server != nil && len(p.held) > 0 {
		_, _ = p.server.Write(p.held)
	}
	p.held = nil
}
