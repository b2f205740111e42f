package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

const (
	// idxWidth is how many leading payload bytes hold the message index.
	idxWidth = 12
	// pubWindow bounds the benchmark publishers' PubAcks in flight.
	pubWindow = 4096
	// prefix is delayd's ingress prefix in every scenario.
	prefix = contract.PrefixDefault
)

// bench holds what every scenario shares.
type bench struct {
	cfg    config
	root   string
	stderr io.Writer
	logMu  sync.Mutex
	tcp    tcpBins // -tcp: the binaries, built once
}

// logf writes one progress line to stderr.
func (b *bench) logf(format string, args ...any) {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	fmt.Fprintf(b.stderr, "%s delaybench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// progress logs "label: n/total" ("label: n" for total 0) every 2 s until
// the returned stop is called.
func (b *bench) progress(label string, total int, count func() int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if total > 0 {
					b.logf("%s: %d/%d", label, count(), total)
				} else {
					b.logf("%s: %d", label, count())
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// env is one embedded nats-server, or the nodes of a cluster, with their
// store directory and a client.
type env struct {
	srv   *server.Server      // node 0: the only node, or the benchmark client's node in a cluster
	nodes []*server.Server    // every node; nodes[0] is srv
	dir   string              // every node's store is under it
	nc    *nats.Conn          // the benchmark's own client, on node 0
	js    jetstream.JetStream // on nc, with a bounded async-publish window
	mu    sync.Mutex
	conns []*nats.Conn
	// -tcp: the nats-server process, its client URL, and how many delayd
	// processes were started (for their log names).
	natsProc *proc
	url      string
	services int
	bench    *bench
}

// newEnv starts a JetStream nats-server storing in a fresh directory under
// the run's root, and connects to it in-process.
func (b *bench) newEnv() (*env, error) {
	dir, err := os.MkdirTemp(b.root, "server-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, bench: b}
	if b.cfg.TCP {
		if err := b.startNATSProcess(e); err != nil {
			e.close()
			return nil, err
		}
		return e, e.connectClient()
	}
	srv, err := startServer(&server.Options{
		ServerName: "delaybench", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
		// nats-server sets the process's block profile rate at start (0:
		// off); -blockprofile's rate must survive it.
		ProfBlockRate: blockProfileRate,
	})
	if err != nil {
		e.close()
		return nil, err
	}
	e.srv, e.nodes = srv, []*server.Server{srv}
	return e, e.connectClient()
}

// newClusterEnv starts a JetStream cluster of n embedded nats-servers on
// loopback with the options of the tests' clusters
// (natstest.ClusterOptions), each storing in a directory of its own under
// the run's root, waits until the cluster is ready (up to
// natstest.ClusterReadyTimeout), and connects to node 0 in-process.
func (b *bench) newClusterEnv(ctx context.Context, n int) (*env, error) {
	dir, err := os.MkdirTemp(b.root, "cluster-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, bench: b}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = filepath.Join(dir, fmt.Sprintf("n%d", i))
	}
	opts, err := natstest.ClusterOptions("delaybench", dirs)
	if err != nil {
		e.close()
		return nil, err
	}
	for _, o := range opts {
		srv, err := startServer(o)
		if err != nil {
			e.close()
			return nil, err
		}
		e.nodes = append(e.nodes, srv)
	}
	e.srv = e.nodes[0]
	deadline := time.Now().Add(natstest.ClusterReadyTimeout)
	for !natstest.ClusterReady(e.nodes) {
		if time.Now().After(deadline) {
			e.close()
			return nil, fmt.Errorf("%d-node cluster not ready within %s", n, natstest.ClusterReadyTimeout)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			e.close()
			return nil, err
		}
	}
	return e, e.connectClient()
}

// startServer starts a nats-server with opts and waits until it accepts
// connections.
func startServer(opts *server.Options) (*server.Server, error) {
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats-server %s not ready within 10s", opts.ServerName)
	}
	return srv, nil
}

// connectClient connects the benchmark's own client to node 0; it closes
// the env on failure.
func (e *env) connectClient() error {
	var err error
	if e.nc, err = e.conn(nil); err != nil {
		e.close()
		return err
	}
	if e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(pubWindow), jetstream.WithPublishAsyncTimeout(10*time.Second)); err != nil {
		e.close()
		return err
	}
	return nil
}

// conn opens another in-process connection to node 0, closed with the env.
func (e *env) conn(onErr func(error)) (*nats.Conn, error) {
	return e.connTo(0, onErr)
}

// connTo opens an in-process connection to node i, reconnecting for ever,
// closed with the env; extra options come last.
func (e *env) connTo(i int, onErr func(error), extra ...nats.Option) (*nats.Conn, error) {
	url, opts := e.url, []nats.Option{nats.MaxReconnects(-1)}
	if url == "" { // in-process
		srv := e.nodes[i]
		url, opts = srv.ClientURL(), append(opts, nats.InProcessServer(srv))
	}
	if onErr != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { onErr(err) }))
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.conns = append(e.conns, nc)
	e.mu.Unlock()
	return nc, nil
}

// close closes every connection, stops every node and removes the stores.
func (e *env) close() {
	e.mu.Lock()
	for _, nc := range e.conns {
		nc.Close()
	}
	e.mu.Unlock()
	for _, srv := range e.nodes {
		srv.Shutdown()
	}
	for _, srv := range e.nodes {
		srv.WaitForShutdown()
	}
	if e.natsProc != nil {
		_ = e.natsProc.stop(30 * time.Second)
	}
	_ = os.RemoveAll(e.dir)
}

// createStream creates a file stream.
func (e *env) createStream(ctx context.Context, cfg jetstream.StreamConfig) error {
	cfg.Storage = jetstream.FileStorage
	_, err := e.js.CreateStream(ctx, cfg)
	if err != nil {
		return fmt.Errorf("create stream %s: %w", cfg.Name, err)
	}
	return nil
}

// streamMsgs returns how many messages a stream holds.
func (e *env) streamMsgs(ctx context.Context, name string) (uint64, error) {
	s, err := e.js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// levelMsgs returns how many messages the level stream of delay d holds
// for target: the routers' epoch markers it also holds
// (docs/guarantees.md#epoch-markers) are not counted.
func (e *env) levelMsgs(ctx context.Context, d time.Duration, target string) (uint64, error) {
	s, err := e.js.Stream(ctx, levels.StreamName(d))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(contract.LevelSubjectPrefix+levels.DurationName(d)+"."+target))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

// waitStreamMsgs polls until the stream holds want messages, and returns the
// time it first saw them; on timeout it returns errTimeout and the count.
func (e *env) waitStreamMsgs(ctx context.Context, name string, want uint64, timeout time.Duration) (time.Time, uint64, error) {
	return waitMsgs(ctx, want, timeout, func() (uint64, error) { return e.streamMsgs(ctx, name) })
}

// waitLevelMsgs polls until the level stream of delay d holds want
// messages for target ([env.levelMsgs]), as [env.waitStreamMsgs].
func (e *env) waitLevelMsgs(ctx context.Context, d time.Duration, target string, want uint64, timeout time.Duration) (time.Time, uint64, error) {
	return waitMsgs(ctx, want, timeout, func() (uint64, error) { return e.levelMsgs(ctx, d, target) })
}

// waitMsgs polls count until it reaches want, and returns the time it
// first did; on timeout it returns errTimeout and the count.
func waitMsgs(ctx context.Context, want uint64, timeout time.Duration, count func() (uint64, error)) (time.Time, uint64, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := count()
		if err != nil {
			return time.Time{}, n, err
		}
		now := time.Now()
		if n >= want {
			return now, n, nil
		}
		if now.After(deadline) {
			return time.Time{}, n, errTimeout
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return time.Time{}, n, err
		}
	}
}

var errTimeout = errors.New("timed out")

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// publishResult is what an async publish run got.
type publishResult struct {
	acked   int           // PubAcks received without error
	elapsed time.Duration // first publish to last PubAck (monotonic)
}

// publishAll publishes n messages built by mk with PublishMsgAsync (window
// [pubWindow]) and waits for every PubAck. A refused publish is not acked.
func (b *bench) publishAll(ctx context.Context, e *env, label string, n int, mk func(i int) *nats.Msg) (publishResult, error) {
	var failed, sent atomic.Int64
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(pubWindow), jetstream.WithPublishAsyncTimeout(30*time.Second),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, _ error) { failed.Add(1) }))
	if err != nil {
		return publishResult{}, err
	}
	stop := b.progress(label+": published", n, func() int { return int(sent.Load()) })
	defer stop()
	start := time.Now()
	for i := range n {
		if ctx.Err() != nil {
			return publishResult{}, ctx.Err()
		}
		if _, err := js.PublishMsgAsync(mk(i), jetstream.WithStallWait(time.Minute)); err != nil {
			failed.Add(1)
		}
		sent.Add(1)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return publishResult{}, errors.New("PubAcks still missing after 1 min")
	case <-ctx.Done():
		return publishResult{}, ctx.Err()
	}
	return publishResult{acked: n - int(failed.Load()), elapsed: time.Since(start)}, nil
}

// payload returns the payload of message i: its index in the first
// [idxWidth] bytes, then dots up to size.
func payload(i, size int) []byte {
	p := make([]byte, size)
	s := strconv.Itoa(i)
	for j := range idxWidth {
		p[j] = '0'
	}
	copy(p[idxWidth-len(s):idxWidth], s)
	for j := idxWidth; j < size; j++ {
		p[j] = '.'
	}
	return p
}

// index reads a payload's message index; -1 if it has none.
func index(p []byte) int {
	if len(p) < idxWidth {
		return -1
	}
	i, err := strconv.Atoi(string(p[:idxWidth]))
	if err != nil {
		return -1
	}
	return i
}

// service is a running delayd service: in this process, or (-tcp) a
// delayd process (proc set, the other fields nil).
type service struct {
	proc   *proc
	svc    *deliver.Service
	nc     *nats.Conn
	lnc    *nats.Conn // the cancel API's lookup connection (deliver.Config.LookupConn)
	node   int        // the node nc is connected to
	cancel context.CancelFunc
	done   chan error
}

// startService runs a delayd service with the level table on its own
// connection to node 0 (as cmd/delayd wires it) and waits until it is
// ready; with -tcp, a delayd process ([env.startDelaydProcess]).
func (e *env) startService(ctx context.Context, table string) (*service, error) {
	if e.url != "" {
		return e.startDelaydProcess(ctx, table)
	}
	return e.startReplica(ctx, 0, deliver.Config{Levels: levels.MustParse(table)})
}

// startReplica runs a delayd service with cfg (its Prefix and cancel share the
// benchmark's) on a connection of its own to node i, wired as cmd/delayd
// wires it (async errors to the service, no reconnect buffer), and waits
// until it is ready: set up and bidding for its leases, holding none yet
// perhaps.
func (e *env) startReplica(ctx context.Context, node int, cfg deliver.Config) (*service, error) {
	var ref atomic.Pointer[deliver.Service]
	nc, err := e.connTo(node, func(err error) {
		if s := ref.Load(); s != nil {
			s.HandleAsyncError(err)
		}
	}, nats.ReconnectBufSize(-1), nats.ReconnectHandler(func(*nats.Conn) {
		if s := ref.Load(); s != nil {
			s.HandleReconnect()
		}
	}))
	if err != nil {
		return nil, err
	}
	// The cancel API's lookups on a connection of their own, as cmd/delayd wires them.
	lnc, err := e.connTo(node, func(error) {})
	if err != nil {
		nc.Close()
		return nil, err
	}
	cfg.Prefix, cfg.LookupConn, cfg.CancelLookupShare = prefix, lnc, e.bench.cfg.CancelShare
	cfg.AnswerKeep, _ = e.bench.cfg.answerKeep() // checked by validate
	svc, err := deliver.New(nc, cfg)
	if err != nil {
		nc.Close()
		lnc.Close()
		return nil, err
	}
	ref.Store(svc)
	rctx, cancel := context.WithCancel(ctx)
	s := &service{svc: svc, nc: nc, lnc: lnc, node: node, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- svc.Run(rctx) }()
	deadline := time.Now().Add(time.Minute)
	for !svc.Ready() {
		select {
		case err := <-s.done:
			cancel()
			return nil, fmt.Errorf("delayd stopped before ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("delayd not ready within 1 min")
		}
		time.Sleep(2 * time.Millisecond)
	}
	return s, nil
}

// stop stops the service, waits for its clean shutdown and closes its
// connection.
func (s *service) stop() error {
	if s.proc != nil {
		return s.proc.stop(30 * time.Second)
	}
	s.cancel()
	select {
	case err := <-s.done:
		s.nc.Close()
		s.lnc.Close()
		return err
	case <-time.After(30 * time.Second):
		return errors.New("delayd did not stop within 30s")
	}
}

// createDelaydStreams creates delayd's streams by running a service until it
// is ready, then stopping it.
func (e *env) createDelaydStreams(ctx context.Context, table string) error {
	s, err := e.startService(ctx, table)
	if err != nil {
		return err
	}
	return s.stop()
}

// delaydMsg is message i to delayd for target at level.
func (b *bench) delaydMsg(i int, target string, level int) *nats.Msg {
	return &nats.Msg{
		Subject: prefix + "." + target,
		Header:  nats.Header{contract.HeaderLevel: []string{strconv.Itoa(level)}},
		Data:    payload(i, b.cfg.Payload),
	}
}

// arrival is one delivery: the message's index, when it arrived and when it
// was due.
type arrival struct {
	idx   int
	at    time.Time
	due   time.Time
	moved bool // it carried Delay-Rescheduled: delivered at a reschedule's new place
}

// collector records core deliveries.
type collector struct {
	mu   sync.Mutex
	recs []arrival
	dues []string // Delay-Due-At, parsed after the run
	sub  *nats.Subscription
}

// subscribe starts a core subscriber on subject on its own connection.
func (e *env) subscribe(subject string, capacity int) (*collector, error) {
	nc, err := e.conn(nil)
	if err != nil {
		return nil, err
	}
	c := &collector{recs: make([]arrival, 0, capacity), dues: make([]string, 0, capacity)}
	c.sub, err = nc.Subscribe(subject, func(m *nats.Msg) {
		at := time.Now()
		due := m.Header.Get(contract.HeaderDueAt)
		c.mu.Lock()
		c.recs = append(c.recs, arrival{idx: index(m.Data), at: at, moved: m.Header.Get(contract.HeaderRescheduled) != ""})
		c.dues = append(c.dues, due)
		c.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	if err := c.sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	return c, nc.Flush()
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// arrivals returns the deliveries with their Delay-Due-At parsed (zero if
// absent).
func (c *collector) arrivals() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]arrival, len(c.recs))
	for i, r := range c.recs {
		r.due, _ = time.Parse(time.RFC3339Nano, c.dues[i])
		out[i] = r
	}
	return out
}

// waitCount polls count until it reaches want or timeout passes.
func (b *bench) waitCount(ctx context.Context, label string, want int, timeout time.Duration, count func() int) bool {
	stop := b.progress(label, want, count)
	defer stop()
	deadline := time.Now().Add(timeout)
	for count() < want {
		if time.Now().After(deadline) {
			b.logf("%s: timed out after %s with %d/%d", label, timeout, count(), want)
			return false
		}
		if sleepCtx(ctx, 5*time.Millisecond) != nil {
			return false
		}
	}
	return true
}

// streamReader reads a stream with an ordered consumer, recording each
// message's store time as its arrival.
type streamReader struct {
	mu   sync.Mutex
	recs []arrival
	cc   jetstream.ConsumeContext
}

// readStream starts an ordered consumer on stream, filtered on filter if
// set; due extracts a message's due time (nil: none).
func (e *env) readStream(ctx context.Context, stream, filter string, capacity int, due func(jetstream.Msg) time.Time) (*streamReader, error) {
	cfg := jetstream.OrderedConsumerConfig{}
	if filter != "" {
		cfg.FilterSubjects = []string{filter}
	}
	cons, err := e.js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	r := &streamReader{recs: make([]arrival, 0, capacity)}
	r.cc, err = cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		a := arrival{idx: index(m.Data()), at: md.Timestamp}
		if due != nil {
			a.due = due(m)
		}
		r.mu.Lock()
		r.recs = append(r.recs, a)
		r.mu.Unlock()
	}, jetstream.PullMaxMessages(2048))
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (r *streamReader) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

func (r *streamReader) stop() []arrival {
	r.cc.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recs
}

// dueHeader reads Delay-Due-At from a message.
func dueHeader(m jetstream.Msg) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, m.Headers().Get(contract.HeaderDueAt))
	return t
}
