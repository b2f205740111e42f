package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// testBundle is one test's server, client and delayd.
type testBundle struct {
	t        *testing.T
	srv      *server.Server
	storeDir string
	nc       *nats.Conn // the test's own client (publisher, subscriber)
	js       jetstream.JetStream
	svc      *deliver.Service
	stopSvc  func()
}

// startServer starts a JetStream nats-server on a free loopback port with
// its store in storeDir, and registers its shutdown.
func startServer(t *testing.T, storeDir string, port int) *server.Server {
	t.Helper()
	opts := natstest.Options(storeDir)
	opts.Port, opts.ServerName = port, "test"
	return natstest.Start(t, opts)
}

// setup starts a server and a client; delayd is started with startDelayd.
func setup(t *testing.T) *testBundle {
	t.Helper()
	dir := t.TempDir()
	b := &testBundle{t: t, storeDir: dir, srv: startServer(t, dir, -1)}
	b.connect()
	return b
}

func (b *testBundle) connect() {
	b.t.Helper()
	nc, err := nats.Connect(b.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.t.Fatal(err)
	}
	b.nc, b.js = nc, js
}

// startDelayd runs a delayd service with the level table and waits until it
// is ready. It is stopped at cleanup, or by b.stopDelayd.
func (b *testBundle) startDelayd(table string, mod ...func(*deliver.Config)) {
	b.t.Helper()
	var svcRef atomic.Pointer[deliver.Service]
	nc, err := nats.Connect(b.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectBufSize(-1), // as cmd/delayd: nothing sent after a reconnect that was made before it
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if svc := svcRef.Load(); svc != nil {
				svc.HandleAsyncError(err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			if svc := svcRef.Load(); svc != nil {
				svc.HandleReconnect()
			}
		}))
	if err != nil {
		b.t.Fatal(err)
	}
	// Cancel tests check answers, not pacing: lookups may take a whole
	// core (TestCancelStormAnswered runs with the default).
	cfg := deliver.Config{Prefix: "delay", Levels: levels.MustParse(table), Logger: testLogger(b.t), CancelLookupShare: 1}
	for _, m := range mod {
		m(&cfg)
	}
	svc, err := deliver.New(nc, cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	svcRef.Store(svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	b.svc = svc
	b.stopSvc = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					b.t.Errorf("delayd Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				b.t.Error("delayd did not stop within 30s")
			}
			nc.Close()
		})
	}
	b.t.Cleanup(b.stopSvc)
	waitFor(b.t, 20*time.Second, "delayd ready", svc.Ready)
}

func (b *testBundle) stopDelayd() { b.stopSvc() }

// testLogger logs to the test log at warn level, or debug with DELAYD_TEST_DEBUG=1.
func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("DELAYD_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// publish publishes through JetStream (so the PubAck means stored) with the
// given headers, and returns the ingress sequence.
func (b *testBundle) publish(subject string, data []byte, hdr nats.Header) uint64 {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		b.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

func level(n int) nats.Header { return nats.Header{"Delay-Level": []string{fmt.Sprint(n)}} }

// received is one delivery seen by a subscriber.
type received struct {
	msg *nats.Msg
	at  time.Time
}

// collector subscribes to a core subject and records every delivery.
type collector struct {
	mu   sync.Mutex
	msgs []received
	ch   chan struct{}
}

func (b *testBundle) collect(subject string) *collector {
	b.t.Helper()
	c := &collector{ch: make(chan struct{}, 1)}
	sub, err := b.nc.Subscribe(subject, func(m *nats.Msg) {
		at := time.Now()
		c.mu.Lock()
		c.msgs = append(c.msgs, received{msg: m, at: at})
		c.mu.Unlock()
		select {
		case c.ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		b.t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := b.nc.Flush(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

func (c *collector) snapshot() []received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// wait waits until n deliveries arrived, or fails the test after timeout.
func (c *collector) wait(t *testing.T, n int, timeout time.Duration) []received {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if got := c.snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-c.ch:
		case <-deadline:
			t.Fatalf("got %d deliveries, want %d within %s", len(c.snapshot()), n, timeout)
		}
	}
}

// waitFor polls cond until it holds, or fails the test.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// createStream creates a stream capturing subjects, for stream-bound targets.
func (b *testBundle) createStream(name string, subjects ...string) jetstream.Stream {
	b.t.Helper()
	s, err := b.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// streamMsgs reads every message of a stream.
func (b *testBundle) streamMsgs(name string) []*jetstream.RawStreamMsg {
	b.t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func (b *testBundle) streamCount(name string) uint64 {
	b.t.Helper()
	s, err := b.js.Stream(context.Background(), name)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Msgs
}

// parseTime parses a Delay-*-At header.
func parseTime(t *testing.T, h nats.Header, key string) time.Time {
	t.Helper()
	v := h.Get(key)
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("%s=%q: %v", key, v, err)
	}
	if len(v) != len("2006-01-02T15:04:05.000000000Z") || v[len(v)-1] != 'Z' {
		t.Fatalf("%s=%q: want RFC 3339 with nanoseconds in UTC", key, v)
	}
	return ts
}

// percentile returns the p-th percentile (0..100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// scannerStats returns the running delayd's stats of one level stream, or
// the zero value if it scans no such stream.
func (b *testBundle) scannerStats(stream string) deliver.ScannerStats {
	_, ss := b.svc.Stats()
	for _, s := range ss {
		if s.Stream == stream {
			return s
		}
	}
	return deliver.ScannerStats{}
}

// forwarded returns how many cascading messages the running delayd's
// scanners moved on to a next level since it started.
func (b *testBundle) forwarded() uint64 {
	var n uint64
	_, ss := b.svc.Stats()
	for _, s := range ss {
		n += s.Forwarded
	}
	return n
}
