package jswire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// testBundle is one test's real nats-server and client.
type testBundle struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context // the test's deadline: every wait ends by it
}

// setup starts a JetStream server (opts nil: natstest's defaults) and
// connects a client; both end with the test.
func setup(t *testing.T, opts *server.Options) *testBundle {
	t.Helper()
	srv := natstest.Start(t, opts)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &testBundle{srv: srv, nc: nc, js: js, ctx: ctx}
}

// stream creates stream name on subjects name.> with direct gets allowed.
func (b *testBundle) stream(t *testing.T, name string) {
	t.Helper()
	_, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
}

// publish stores m and returns its stream sequence.
func (b *testBundle) publish(t *testing.T, m *nats.Msg) uint64 {
	t.Helper()
	ack, err := b.js.PublishMsg(b.ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// consumer creates a durable AckNone pull consumer.
func (b *testBundle) consumer(t *testing.T, stream, name string, cfg jetstream.ConsumerConfig) {
	t.Helper()
	cfg.Durable, cfg.AckPolicy = name, jetstream.AckNonePolicy
	if _, err := b.js.CreateConsumer(b.ctx, stream, cfg); err != nil {
		t.Fatal(err)
	}
}

// watch subscribes subject on the test's connection, buffering everything
// it receives (a channel subscription: status messages are messages).
func (b *testBundle) watch(t *testing.T, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 1024)
	sub, err := b.nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// pulled is one result of Pull.Next.
type pulled struct {
	m   *nats.Msg
	err error
}

// run calls p.Next, blocking, on its own goroutine (the Pull's owner) until
// it returns an error, and hands every message and the final error to the
// returned channel. The Pull stops with the test.
func (b *testBundle) run(t *testing.T, p *Pull) <-chan pulled {
	t.Helper()
	out := make(chan pulled, 1024)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := p.Next(ctx, nil, true, 0)
			if m != nil || err != nil {
				out <- pulled{m, err}
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; p.Stop() })
	return out
}

// next waits for the next result from run, failing the test at its deadline.
func (b *testBundle) next(t *testing.T, ch <-chan pulled, what string) pulled {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-b.ctx.Done():
		t.Fatalf("%s: nothing by the test's deadline", what)
		return pulled{}
	}
}

// waitFor waits for a message on ch that ok accepts.
func (b *testBundle) waitFor(t *testing.T, ch <-chan *nats.Msg, what string, ok func(*nats.Msg) bool) *nats.Msg {
	t.Helper()
	for {
		select {
		case m := <-ch:
			if ok(m) {
				return m
			}
		case <-b.ctx.Done():
			t.Fatalf("no %s by the test's deadline", what)
			return nil
		}
	}
}

// TestPullInOrder reads a stream through a real consumer in both
// reply-subject formats the server writes: every message once, in stream
// order, with its metadata; a stored message that imitates a status is
// data like any other.
func TestPullInOrder(t *testing.T) {
	t.Parallel()
	for _, format := range []struct {
		name   string
		flags  map[string]bool
		tokens int
	}{
		{"v1 ack subjects", nil, 9},
		{"v2 ack subjects", map[string]bool{"js_ack_fc_v2": true}, 11},
	} {
		t.Run(format.name, func(t *testing.T) {
			t.Parallel()
			opts := natstest.Options(t.TempDir())
			opts.FeatureFlags = format.flags
			b := setup(t, opts)
			b.stream(t, "ORDERS")
			const n = 50
			for i := 1; i <= n; i++ {
				m := &nats.Msg{Subject: fmt.Sprintf("orders.%d", i%3), Data: fmt.Appendf(nil, "m%d", i)}
				if i%10 == 0 {
					// A publisher's imitations of the statuses that end a pull.
					m.Data, m.Header = nil, nats.Header{"Status": {"409"}, "Description": {"Consumer Deleted"}}
					if i%20 == 0 {
						m.Header = nats.Header{"Status": {"503"}}
					}
				}
				b.publish(t, m)
			}
			b.consumer(t, "ORDERS", "reader", jetstream.ConsumerConfig{})
			p, err := NewPull(b.nc, "ORDERS", "reader", 8, 0)
			if err != nil {
				t.Fatal(err)
			}
			out := b.run(t, p)
			for i := 1; i <= n; i++ {
				r := b.next(t, out, fmt.Sprintf("message %d", i))
				if r.err != nil {
					t.Fatalf("message %d: %v", i, r.err)
				}
				meta, ok := ParseAck(r.m.Reply)
				if !ok || meta.StreamSeq != uint64(i) || meta.Delivered != 1 || meta.Stored.IsZero() {
					t.Fatalf("message %d: reply %q reads %+v, %v", i, r.m.Reply, meta, ok)
				}
				if got := strings.Count(r.m.Reply, ".") + 1; got != format.tokens {
					t.Fatalf("reply %q has %d tokens, want %d", r.m.Reply, got, format.tokens)
				}
				if i%10 != 0 && string(r.m.Data) != fmt.Sprintf("m%d", i) {
					t.Fatalf("message %d: payload %q", i, r.m.Data)
				}
				if i%10 == 0 && r.m.Header.Get("Status") == "" {
					t.Fatalf("message %d: headers %v", i, r.m.Header)
				}
			}
		})
	}
}

// TestPullSurvives408 lets the server expire a pull request (408 Request
// Timeout with Nats-Pending-Messages) and checks that a message stored
// afterwards still arrives: the 408 voids the request and Next asks again.
// The missing-heartbeat watchdog is off here, so only the 408 can do it.
func TestPullSurvives408(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "ORDERS")
	b.consumer(t, "ORDERS", "reader", jetstream.ConsumerConfig{})
	p, err := newPull(b.nc, "ORDERS", "reader", 4, 0, 300*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	p.heartbeat = time.Hour // the watchdog; the requests still ask for 100 ms heartbeats
	inbox := b.watch(t, p.inbox)
	out := b.run(t, p)
	b.waitFor(t, inbox, "408", func(m *nats.Msg) bool { return m.Header.Get("Status") == "408" })
	seq := b.publish(t, &nats.Msg{Subject: "orders.x", Data: []byte("after")})
	r := b.next(t, out, "the message stored after a 408")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if meta, _ := ParseAck(r.m.Reply); meta.StreamSeq != seq || string(r.m.Data) != "after" {
		t.Fatalf("got %q (%q), want sequence %d", r.m.Data, r.m.Reply, seq)
	}
}

// TestPullMissingHeartbeat has the server drop a pull request without a
// word: the consumer's one waiting slot (MaxWaiting 1) is held by another
// client's request, and a request that asks for heartbeats gets no 409
// Exceeded MaxWaiting (nats-server avoids the re-request loop). Nothing,
// heartbeats included, arrives for the Pull; after twice its heartbeat it
// must ask again, and once the slot is free a stored message arrives.
func TestPullMissingHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "ORDERS")
	b.consumer(t, "ORDERS", "reader", jetstream.ConsumerConfig{MaxWaiting: 1})
	next := "$JS.API.CONSUMER.MSG.NEXT.ORDERS.reader"
	requests := b.watch(t, next)

	// The other client's request holds the slot for 4 s: long enough that
	// the Pull's first request finds it taken.
	blocker := b.nc.NewInbox()
	blocked := b.watch(t, blocker)
	if err := b.nc.PublishRequest(next, blocker, []byte(`{"batch":1,"expires":4000000000}`)); err != nil {
		t.Fatal(err)
	}
	for {
		c, err := b.js.Consumer(b.ctx, "ORDERS", "reader")
		if err != nil {
			t.Fatal(err)
		}
		if c.CachedInfo().NumWaiting == 1 {
			break
		}
		if b.ctx.Err() != nil {
			t.Fatal("the blocking request never waited")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state, with the test's deadline
	}

	p, err := newPull(b.nc, "ORDERS", "reader", 4, 0, 5*time.Second, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	out := b.run(t, p)
	b.waitFor(t, blocked, "408 for the blocking request", func(m *nats.Msg) bool { return m.Header.Get("Status") == "408" })
	seq := b.publish(t, &nats.Msg{Subject: "orders.x", Data: []byte("after")})
	r := b.next(t, out, "the message stored after the slot freed")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if meta, _ := ParseAck(r.m.Reply); meta.StreamSeq != seq {
		t.Fatalf("got %q, want sequence %d", r.m.Reply, seq)
	}
	// The Pull asked more than once: the first request was dropped.
	n := 0
	for len(requests) > 0 {
		if (<-requests).Reply == p.inbox {
			n++
		}
	}
	if n < 2 {
		t.Fatalf("the Pull sent %d requests, want a repeat after the silence", n)
	}
}

// TestPullConsumerGone checks the two ways a consumer ends a pull: 409
// Consumer Deleted to a waiting request, and 503 no responders for a
// consumer that does not exist.
func TestPullConsumerGone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "ORDERS")
	t.Run("409 Consumer Deleted", func(t *testing.T) {
		b.consumer(t, "ORDERS", "reader", jetstream.ConsumerConfig{})
		p, err := NewPull(b.nc, "ORDERS", "reader", 4, 0)
		if err != nil {
			t.Fatal(err)
		}
		inbox := b.watch(t, p.inbox)
		out := b.run(t, p)
		b.publish(t, &nats.Msg{Subject: "orders.x", Data: []byte("one")})
		if r := b.next(t, out, "the stored message"); r.err != nil || string(r.m.Data) != "one" {
			t.Fatalf("got %+v", r)
		}
		if err := b.js.DeleteConsumer(b.ctx, "ORDERS", "reader"); err != nil {
			t.Fatal(err)
		}
		b.waitFor(t, inbox, "409", func(m *nats.Msg) bool { return m.Header.Get("Status") == "409" })
		if r := b.next(t, out, "the end of the pull"); r.err != ErrConsumerDeleted {
			t.Fatalf("got %+v, want ErrConsumerDeleted", r)
		}
	})
	t.Run("503 no responders", func(t *testing.T) {
		p, err := NewPull(b.nc, "ORDERS", "nobody", 4, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r := b.next(t, b.run(t, p), "the end of the pull"); r.err != ErrConsumerDeleted {
			t.Fatalf("got %+v, want ErrConsumerDeleted", r)
		}
	})
}

// TestPullReissues answers the Pull's first request with a scripted
// JetStream peer on a real server, for the statuses a single server cannot
// be made to send on demand, and hands the next request to a real consumer
// holding one message. The message arrives only if the status voided the
// first request and Next asked again: the watchdog is off, so only the
// status can make it ask.
func TestPullReissues(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "ORDERS")
	b.publish(t, &nats.Msg{Subject: "orders.x", Data: []byte("x")})
	for i, st := range []*nats.Msg{
		status("404", "No Messages"),
		status("408", "Request Timeout", "Nats-Pending-Messages", "8", "Nats-Pending-Bytes", "0"),
		status("409", "Exceeded MaxWaiting"),
		status("409", "Exceeded MaxRequestBatch of 2"),
		status("409", "Leadership Change"),
		status("409", "Server Shutdown"),
	} {
		t.Run(st.Header.Get("Status")+" "+st.Header.Get("Description"), func(t *testing.T) {
			peer, real := fmt.Sprintf("peer%d", i), fmt.Sprintf("real%d", i)
			b.consumer(t, "ORDERS", real, jetstream.ConsumerConfig{})
			requests := b.watch(t, "$JS.API.CONSUMER.MSG.NEXT.ORDERS."+peer)
			p, err := newPull(b.nc, "ORDERS", peer, 8, 0, time.Minute, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			p.heartbeat = time.Hour // the watchdog
			out := b.run(t, p)
			first := b.waitFor(t, requests, "first request", func(*nats.Msg) bool { return true })
			// A heartbeat first: it changes nothing.
			hb := status("100", "Idle Heartbeat", "Nats-Last-Consumer", "0", "Nats-Last-Stream", "0")
			for _, m := range []*nats.Msg{hb, st} {
				m.Subject = first.Reply
				if err := b.nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
			}
			second := b.waitFor(t, requests, "second request (after the status)", func(*nats.Msg) bool { return true })
			if err := b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.ORDERS."+real, second.Reply, second.Data); err != nil {
				t.Fatal(err)
			}
			r := b.next(t, out, "the message")
			if meta, _ := ParseAck(r.m.Reply); r.err != nil || string(r.m.Data) != "x" || meta.StreamSeq != 1 {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

// TestPullNoHeartbeat: a pull whose consumer's server hangs gets nothing,
// heartbeats included. A subscriber stands in for that server: it takes
// the requests for a consumer that does not exist (so no 503 no
// responders) and answers none. With FailUnanswered the Pull asks again
// after the silence and, that unanswered too, Next returns ErrNoHeartbeat
// after exactly two requests. Without it, the Pull goes on asking and
// Next waits until its context ends (as every Pull did before the
// option: seen to block to the test's deadline).
func TestPullNoHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const subject = "$JS.API.CONSUMER.MSG.NEXT.HUNG.reader"
	requests := b.watch(t, subject)
	pull := func() *Pull {
		p, err := newPull(b.nc, "HUNG", "reader", 4, 0, 5*time.Second, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		return p
	}
	count := func(p *Pull) int {
		n := 0
		for len(requests) > 0 {
			if (<-requests).Reply == p.inbox {
				n++
			}
		}
		return n
	}

	p := pull()
	p.FailUnanswered()
	if m, err := p.Next(b.ctx, nil, true, 0); m != nil || !errors.Is(err, ErrNoHeartbeat) {
		t.Fatalf("Next from a server that answers nothing = %v, %v; want ErrNoHeartbeat", m, err)
	}
	if n := count(p); n != 2 {
		t.Fatalf("the Pull sent %d requests before ErrNoHeartbeat, want 2: the first and one asked again", n)
	}

	// Without the option (the default), it asks again and again.
	p = pull()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second) // twenty heartbeats
	defer cancel()
	if m, err := p.Next(ctx, nil, true, 0); m != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next without FailUnanswered = %v, %v; want its context's end", m, err)
	}
	if n := count(p); n < 3 {
		t.Fatalf("the Pull sent %d requests, want it to go on asking after each silence", n)
	}
}
