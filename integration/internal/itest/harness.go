package itest

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

// Bundle is one test's server, client and delayd.
type Bundle struct {
	T        *testing.T
	Srv      *server.Server
	StoreDir string
	NC       *nats.Conn // the test's own client (publisher, subscriber)
	JS       jetstream.JetStream
	Svc      *deliver.Service
	stopSvc  func()
	running  int // services StartDelayd started and that have not been stopped
}

// StartServer starts a JetStream nats-server on a free loopback port with
// its store in storeDir, and registers its shutdown.
func StartServer(t *testing.T, storeDir string, port int) *server.Server {
	t.Helper()
	opts := natstest.Options(storeDir)
	opts.Port, opts.ServerName = port, "test"
	return natstest.Start(t, opts)
}

// Setup starts a server and a client; delayd is started with startDelayd.
func Setup(t *testing.T) *Bundle {
	t.Helper()
	dir := t.TempDir()
	b := &Bundle{T: t, StoreDir: dir, Srv: StartServer(t, dir, -1)}
	b.Connect()
	return b
}

// Connect connects the test's own client (NC, JS) to Srv, reconnecting for
// ever; it is closed at cleanup.
func (b *Bundle) Connect() {
	b.T.Helper()
	nc, err := nats.Connect(b.Srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.T.Fatal(err)
	}
	b.NC, b.JS = nc, js
}

// LeaseTTL is the lease TTL of the delayd services and processes the
// harness starts ([Bundle.StartDelayd], [Bundle.StartProcess]) unless a
// test sets its own. These tests have one delayd and no takeover to wait
// for, so a TTL ten times the default 1.5 s costs nothing, and CPU
// starvation cannot expire it: under -race on a busy 2-core machine
// renewals stalled 1.35 s at once, the leases expired, and the levels'
// re-deliveries after taking them back (at-least-once) broke exact
// counts. Tests about failover set a short TTL explicitly
// ([KillLeaseTTL]); a service that loses its connection still takes its
// own lease back at once when it reconnects.
const LeaseTTL = 15 * time.Second

// StartDelayd runs a delayd service with the level table and waits until it
// is ready. Its lease TTL is [LeaseTTL] unless mod sets another. It is stopped at cleanup, or by b.stopDelayd.
func (b *Bundle) StartDelayd(table string, mod ...func(*deliver.Config)) {
	b.T.Helper()
	// A service already running in this bundle makes this one a replica:
	// it owns only its share of the leases.
	replica := b.running > 0
	var svcRef atomic.Pointer[deliver.Service]
	nc, err := nats.Connect(b.Srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
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
		b.T.Fatal(err)
	}
	// Cancel tests check answers, not pacing: lookups may take a whole
	// core (TestCancelStormAnswered runs with the default).
	cfg := deliver.Config{Prefix: "delay", Levels: levels.MustParse(table), Logger: Logger(b.T), CancelLookupShare: 1, LeaseTTL: LeaseTTL}
	for _, m := range mod {
		m(&cfg)
	}
	svc, err := deliver.New(nc, cfg)
	if err != nil {
		b.T.Fatal(err)
	}
	svcRef.Store(svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	b.Svc = svc
	b.stopSvc = func() {
		once.Do(func() {
			b.running--
			cancel()
			select {
			case err := <-done:
				if err != nil {
					b.T.Errorf("delayd Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				b.T.Error("delayd did not stop within 30s")
			}
			nc.Close()
		})
	}
	b.running++
	b.T.Cleanup(b.stopSvc)
	WaitFor(b.T, 20*time.Second, "delayd ready", svc.Ready)
	// Ready does not wait for leases (holding none is ready). The only
	// bidder here, the service takes every level's lease; wait until each
	// level's scanner has started, so the level decides cancels and merge
	// checks from the first message on. Until then a merge check counts
	// the first message as not pending (docs/guide.md#merge-delay-merge-key),
	// which missed merges under -race on a loaded CI machine (TestMerge).
	// A replica waits only for the scanners it owns.
	WaitFor(b.T, 20*time.Second, "every level's scanner started", func() bool {
		_, ss := svc.Stats()
		for _, s := range ss {
			if (s.Owner || !replica) && (!s.Owner || s.Steps == 0) {
				return false
			}
		}
		return len(ss) > 0
	})
}

// StopDelayd stops the delayd service started by StartDelayd and waits up to
// 30 s for its Run to return.
func (b *Bundle) StopDelayd() { b.stopSvc() }

// Logger logs to the test log at warn level, or debug with DELAYD_TEST_DEBUG=1.
func Logger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("DELAYD_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(TWriter{T: t}, &slog.HandlerOptions{Level: level}))
}

// TWriter is an [io.Writer] that logs each write to T's test log.
type TWriter struct{ T *testing.T }

// Write logs p as one line of the test log; it never fails.
func (w TWriter) Write(p []byte) (int, error) {
	w.T.Log(string(p))
	return len(p), nil
}

// Publish publishes through JetStream (so the PubAck means stored) with the
// given headers, and returns the ingress sequence.
func (b *Bundle) Publish(subject string, data []byte, hdr nats.Header) uint64 {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		b.T.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// Level returns the headers of a message published at delay level n
// (Delay-Level: n).
func Level(n int) nats.Header { return nats.Header{"Delay-Level": []string{fmt.Sprint(n)}} }

// Received is one delivery seen by a subscriber.
type Received struct {
	Msg *nats.Msg
	At  time.Time
}

// Collector subscribes to a core subject and records every delivery.
type Collector struct {
	mu   sync.Mutex
	msgs []Received
	Ch   chan struct{} // gets a value (if it has room) after each delivery
}

// Collect subscribes the test's client to subject (no pending limits) and
// returns the Collector of its deliveries; it unsubscribes at cleanup.
func (b *Bundle) Collect(subject string) *Collector {
	b.T.Helper()
	c := &Collector{Ch: make(chan struct{}, 1)}
	sub, err := b.NC.Subscribe(subject, func(m *nats.Msg) {
		at := time.Now()
		c.mu.Lock()
		c.msgs = append(c.msgs, Received{Msg: m, At: at})
		c.mu.Unlock()
		select {
		case c.Ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		b.T.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := b.NC.Flush(); err != nil {
		b.T.Fatal(err)
	}
	b.T.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

// Snapshot returns a copy of the deliveries so far, in arrival order.
func (c *Collector) Snapshot() []Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// Wait waits until n deliveries arrived, or fails the test after timeout
// (three times timeout under the race detector: [Liveness]).
func (c *Collector) Wait(t *testing.T, n int, timeout time.Duration) []Received {
	t.Helper()
	timeout = Liveness(timeout)
	deadline := time.After(timeout)
	for {
		if got := c.Snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-c.Ch:
		case <-deadline:
			t.Fatalf("got %d deliveries, want %d within %s", len(c.Snapshot()), n, timeout)
		}
	}
}

// Liveness returns how long to wait for something that must happen, given
// timeout for a plain build: three times timeout under the race detector
// ([Race]), which slows delayd and JetStream several times over. Only a
// wait whose expiry fails the test is a liveness bound; a bound that is
// the property under test (late by less than, before the fence) must not
// go through it.
func Liveness(timeout time.Duration) time.Duration {
	if Race {
		return 3 * timeout
	}
	return timeout
}

// WaitFor polls cond until it holds, or fails the test after timeout
// (three times timeout under the race detector: [Liveness]).
func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout = Liveness(timeout)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CreateStream creates a stream capturing subjects, for stream-bound targets.
func (b *Bundle) CreateStream(name string, subjects ...string) jetstream.Stream {
	b.T.Helper()
	s, err := b.JS.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
	if err != nil {
		b.T.Fatal(err)
	}
	return s
}

// StreamMsgs reads every message of a stream.
func (b *Bundle) StreamMsgs(name string) []*jetstream.RawStreamMsg {
	b.T.Helper()
	ctx := context.Background()
	s, err := b.JS.Stream(ctx, name)
	if err != nil {
		b.T.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.T.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			b.T.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// StreamCount returns how many messages the stream holds now.
func (b *Bundle) StreamCount(name string) uint64 {
	b.T.Helper()
	s, err := b.JS.Stream(context.Background(), name)
	if err != nil {
		b.T.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		b.T.Fatal(err)
	}
	return info.State.Msgs
}

// Percentile returns the p-th percentile (0..100) of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// ScannerStats returns the running delayd's stats of one level stream, or
// the zero value if it scans no such stream.
func (b *Bundle) ScannerStats(stream string) deliver.ScannerStats {
	_, ss := b.Svc.Stats()
	for _, s := range ss {
		if s.Stream == stream {
			return s
		}
	}
	return deliver.ScannerStats{}
}

// Forwarded returns how many cascading messages the running delayd's
// scanners moved on to a next level since it started.
func (b *Bundle) Forwarded() uint64 {
	var n uint64
	_, ss := b.Svc.Stats()
	for _, s := range ss {
		n += s.Forwarded
	}
	return n
}
