// Command delayd gives NATS JetStream delayed delivery by level.
//
// With no configuration it starts an embedded nats-server with JetStream on
// nats://127.0.0.1:4222, storing data in ./delayd-data. With DELAYD_NATS_URL
// it connects to that server or cluster instead. See README.md and
// docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lmittmann/tint"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/console"
	"github.com/delayd/delayd/metrics"
)

func main() {
	os.Exit(run())
}

// Exit codes.
const (
	exitOK     = 0
	exitError  = 1 // a runtime failure, or a second signal
	exitConfig = 2 // a bad configuration
)

// shutdownTimeout bounds a graceful shutdown, from the first signal to the exit: past it, delayd logs
// msgShutdownBound with the step under way and exits with exitError (docs/operations.md#configuration,
// the paragraph on signals).
const shutdownTimeout = 25 * time.Second

// Log messages of a shutdown that could not finish its work: delayd exits with exitError after either.
const (
	msgShutdownBound       = "graceful shutdown did not end in time; exiting"                // past shutdownTimeout
	msgShutdownUnconfirmed = "offset commits unconfirmed at shutdown; exiting with an error" // a level's last offset write unacknowledged
	msgShutdownConnLost    = "NATS connection lost during shutdown; exiting with an error"   // leases, purges and the drain unconfirmed
)

func run() int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(os.Stderr, "delayd: bad configuration: %v\n", err)
		return exitConfig
	}
	logger := newLogger(cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The step of the shutdown under way, for the log line of a shutdown that does not end in time.
	var step atomic.Pointer[string]
	setStep := func(s string) { step.Store(&s) }
	setStep("stopping the delivery service: confirming deliveries, committing offsets, releasing leases")
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		logger.Info("shutting down; a second signal exits at once", slog.String("signal", sig.String()), slog.Duration("bound", shutdownTimeout))
		cancel()
		// Each step of the shutdown is bounded on its own; a server that answers nothing (an embedded one whose
		// store was deleted) can still make them add up, so the whole is bounded too.
		bound := time.NewTimer(shutdownTimeout)
		select {
		case sig = <-sigs:
			logger.Warn("second signal: exiting at once", slog.String("signal", sig.String()))
		case <-bound.C:
			logger.Error(msgShutdownBound, slog.Duration("bound", shutdownTimeout), slog.String("step", *step.Load()),
				slog.String("consequence", "offsets not committed: deliveries past the last committed offset are delivered again at the next start; leases not released expire after DELAYD_LEASE_TTL"))
		}
		os.Exit(exitError)
	}()

	// Auth and TLS options load their files now, so a bad file is a configuration error. No option value is logged.
	opts, err := cfg.NATSOptions()
	if err != nil {
		fmt.Fprintf(os.Stderr, "delayd: bad configuration: %v\n", err)
		return exitConfig
	}
	var (
		srv *server.Server
		url = cfg.NATSURL
	)
	if url == "" {
		var lock *storeLock
		srv, lock, err = startEmbedded(cfg, logger)
		if err != nil {
			logger.Error("embedded nats-server failed to start", slog.Any("error", err))
			return exitError
		}
		defer lock.Release() // after the server's shutdown below (defers run last first)
		defer func() {
			setStep("shutting down the embedded nats-server")
			shutdownEmbedded(srv, logger)
		}()
		url = srv.ClientURL()
		opts = append(opts, nats.InProcessServer(srv))
		logger.Info("embedded nats-server ready", slog.String("url", url), slog.String("store_dir", cfg.StoreDir))
	}
	c, code := connectAll(ctx, cancel, url, cfg, logger, opts, setStep)
	if c == nil {
		return code
	}
	// Closes the lookup connection, cancels ctx and drains nc, before the embedded server's shutdown above.
	defer c.close()
	return serve(ctx, cfg, logger, srv != nil, c)
}

// conns groups delayd's two NATS connections and what their handlers share with run and serve: the service
// connection nc, the cancel API's lookup connection lnc, and the flags their handlers set. The handlers (nats.go's
// callback goroutines) write connLost, lostInShutdown and lookupClosing, and read svc; serve stores svc once the
// service is built and reads the flags after Run returns; close (run's goroutine) sets lookupClosing.
type conns struct {
	nc  *nats.Conn
	lnc *nats.Conn

	cancel  context.CancelFunc // run's: a handler that finds a connection closed for good stops delayd with it
	logger  *slog.Logger
	setStep func(string) // names the shutdown's step under way

	closed         chan struct{}                   // closed by nc's ClosedHandler
	connLost       atomic.Bool                     // a connection closed for good before the shutdown: exitError
	lostInShutdown atomic.Bool                     // nc disconnected after the signal: the shutdown's writes unconfirmed
	lookupClosing  atomic.Bool                     // delayd closes lnc itself: its ClosedHandler stays quiet
	svc            atomic.Pointer[deliver.Service] // for the async error and reconnect handlers, once built
}

// connectAll connects nc and the cancel API's lookup connection to url with opts, each with its handlers. It returns
// nil and the exit code if either fails, having undone what it did; else the caller defers close.
func connectAll(ctx context.Context, cancel context.CancelFunc, url string, cfg config.Config, logger *slog.Logger, opts []nats.Option, setStep func(string)) (*conns, int) {
	c := &conns{cancel: cancel, logger: logger, setStep: setStep, closed: make(chan struct{})}
	// The cancel API's lookup connection gets the same server, auth and TLS options, and handlers of its own.
	lookupOpts := slices.Clone(opts)
	// The connection closes for good only when delayd drains it at shutdown, or when nats.go gives up (the same
	// authentication error twice in a row): then delayd stops with an error rather than retry on a dead connection.
	opts = append(opts, nats.ClosedHandler(func(nc *nats.Conn) {
		defer close(c.closed)
		if ctx.Err() == nil {
			c.connLost.Store(true)
			logger.Error("NATS connection closed; stopping", errAttr(nc.LastError()))
			cancel()
		}
	}))
	// The service learns of refused publishes through the async error handler.
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		attrs := []any{errAttr(err)}
		if sub != nil {
			attrs = append(attrs, slog.String("subject", sub.Subject))
		}
		logger.Error("NATS async error", attrs...)
		if svc := c.svc.Load(); svc != nil {
			svc.HandleAsyncError(err)
		}
	}))
	opts = append(opts, nats.ReconnectHandler(func(nc *nats.Conn) {
		logger.Info("reconnected to NATS", slog.String("url", config.RedactURLs(nc.ConnectedUrlRedacted())))
		if svc := c.svc.Load(); svc != nil {
			svc.HandleReconnect()
		}
	}))
	// A disconnect after the signal (a server found stale, a connection cut) leaves the shutdown's writes
	// unconfirmed: lease releases, purges, the drain; the offsets may be committed all the same.
	opts = append(opts, nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		if err == nil {
			return // closed by delayd itself (the drain)
		}
		logger.Warn("disconnected from NATS", slog.Any("error", err))
		if ctx.Err() != nil {
			c.lostInShutdown.Store(true)
		}
	}))
	var err error
	c.nc, err = connect(url, cfg, logger, opts...)
	if err != nil {
		logger.Error("connect to NATS failed", slog.Any("error", err))
		return nil, exitError
	}
	// A second connection for the cancel API's id-index lookups: nats-server walks the index inline on the read loop
	// of the connection that asks, so on nc every delivery behind a lookup would wait for it (deliver.Config.LookupConn).
	c.lnc, err = connect(url, cfg, logger, append(lookupOpts, nats.Name("delayd-lookups"),
		// Its own messages: "connected to NATS", "disconnected from NATS" and "reconnected to NATS" are nc's.
		nats.ConnectHandler(func(lc *nats.Conn) {
			logger.Debug("cancel lookup connection connected", slog.String("url", config.RedactURLs(lc.ConnectedUrlRedacted())))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Debug("cancel lookup connection disconnected", slog.Any("error", err))
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			logger.Error("NATS async error", slog.String("connection", "delayd-lookups"), errAttr(err))
		}),
		nats.ClosedHandler(func(lc *nats.Conn) {
			if ctx.Err() == nil && !c.lookupClosing.Load() {
				c.connLost.Store(true)
				logger.Error("NATS connection closed; stopping", slog.String("connection", "delayd-lookups"), errAttr(lc.LastError()))
				cancel()
			}
		}))...)
	if err != nil {
		logger.Error("connect to NATS failed", slog.String("connection", "delayd-lookups"), slog.Any("error", err))
		cancel() // delayd's own stop, before the drain (see close)
		c.drainNC()
		return nil, exitError
	}
	if !c.nc.IsConnected() { // once connected, the ConnectHandler logs it
		logger.Warn("NATS not reachable yet; retrying for ever", slog.String("url", config.RedactURLs(cfg.NATSURL)), slog.String("auth", cfg.AuthMethod()), errAttr(c.nc.LastError()))
	}
	return c, exitOK
}

// close closes the lookup connection, cancels run's context and drains nc, in that order.
//
// Every return of run after connectAll is delayd's own stop, whatever its cause (a DELAYD_HTTP_ADDR in use, a bad
// service configuration, Run's error): ctx is cancelled before the drain, so the connections' ClosedHandlers do not
// log a second, false cause ("NATS connection closed; stopping").
func (c *conns) close() {
	// Only reads: nothing to drain; closed before nc drains.
	c.lookupClosing.Store(true)
	c.lnc.Close()
	c.cancel()
	c.drainNC()
}

// drainNC sends what is buffered (the router's last ingress acks, the last offset writes) and waits for the drain
// before the embedded server and the process go away.
func (c *conns) drainNC() {
	c.setStep("draining the NATS connection")
	_ = c.nc.FlushTimeout(5 * time.Second)
	if err := c.nc.Drain(); err == nil {
		select {
		case <-c.closed:
		case <-time.After(10 * time.Second):
			c.logger.Warn("NATS connection did not drain within 10s")
		}
	}
}

// serve builds the delivery service on c's connections, serves its stats API and DELAYD_HTTP_ADDR, runs it until
// ctx ends and returns delayd's exit code. embedded says the NATS server is delayd's own.
func serve(ctx context.Context, cfg config.Config, logger *slog.Logger, embedded bool, c *conns) int {
	var m *metrics.Metrics // set before Run; the hook runs only on Run's scanners
	svc, err := deliver.New(c.nc, deliver.Config{
		Prefix:     cfg.Prefix,
		Levels:     cfg.Levels,
		Partitions: cfg.Partitions,
		Replicas:   cfg.Replicas,

		IngressPartitions: cfg.IngressPartitions,
		StartGrace:        cfg.StartGrace,
		// A restart of delayd restarts its embedded server, so core
		// subscribers reconnect after a start too.
		GraceAtStart:      embedded,
		MaxDelay:          cfg.MaxDelay,
		CancelLookupShare: cfg.CancelShare,
		LookupConn:        c.lnc,
		LeaseTTL:          cfg.LeaseTTL,
		AnswerKeep:        answerKeep(cfg.AnswerKeep),
		AnswerMaxBytes:    int64(cfg.AnswerMaxBytes),
		Targets:           cfg.TargetPolicy(),
		Logger:            logger,
		OnDelivery:        func(stream string, lateness time.Duration) { m.ObserveDelivery(stream, lateness) },
	})
	if err != nil {
		logger.Error("bad service configuration", slog.Any("error", err))
		return exitConfig
	}
	m = metrics.New(svc, c.nc)
	c.svc.Store(svc)
	logger.Info("level table", slog.String("levels", cfg.Levels.String()), slog.String("publish_to", cfg.Prefix+".<subject>"), slog.String("header", contract.HeaderLevel+": 0.."+fmt.Sprint(cfg.Levels.Len())),
		slog.Int("precision_levels", len(cfg.Levels.PrecisionLevels())))

	if stopStats, err := svc.StartStatsAPI(); err != nil {
		logger.Warn("stats API not served", slog.Any("error", err))
	} else {
		defer func() { _ = stopStats() }()
	}

	if cfg.HTTPAddr != "" {
		hs, err := serveHTTP(cfg.HTTP, c.nc, svc, m, logger)
		if err != nil {
			logger.Error("DELAYD_HTTP_ADDR: cannot listen", slog.String("addr", cfg.HTTPAddr), slog.Any("error", err))
			return exitConfig
		}
		defer func() { _ = hs.Close() }()
	}

	if p := cfg.TargetPolicy(); len(p.Allow)+len(p.Deny) > 0 {
		logger.Info("target policy", slog.String("allow", cfg.AllowTargets.String()), slog.String("deny", cfg.DenyTargets.String()))
	}

	if err := svc.Run(ctx); err != nil {
		return runErrorCode(logger, err)
	}
	if c.connLost.Load() {
		return exitError
	}
	if c.lostInShutdown.Load() {
		// Nothing is lost: what was not committed is delivered again at the next start, and leases not
		// released are taken by others after their TTL.
		logger.Error(msgShutdownConnLost, slog.String("consequence",
			"leases not released are taken after their TTL; deliveries past the last acknowledged offset are delivered again"))
		return exitError
	}
	if lag := unconfirmedOffsets(svc); len(lag) > 0 {
		// Each scanner waited opTimeout for its last offset write; a server that answers nothing (an embedded one
		// whose store was deleted) leaves them unacknowledged. Nothing is lost: the next start delivers again
		// from the last acknowledged offset.
		logger.Error(msgShutdownUnconfirmed, slog.String("streams", strings.Join(lag, " ")),
			slog.String("consequence", "deliveries past the last acknowledged offset are delivered again at the next start"))
		return exitError
	}
	logger.Info("delayd stopped cleanly")
	return exitOK
}

// runErrorCode logs the error the service's Run returned and gives its exit code: exitConfig for a configuration
// this server or a live replica cannot run (also written to stderr), exitError for anything else.
func runErrorCode(logger *slog.Logger, err error) int {
	if errors.Is(err, deliver.ErrReplicasUnsupported) {
		logger.Error("delayd cannot start: the server cannot hold replicated streams", slog.Any("error", err))
		fmt.Fprintf(os.Stderr, "delayd: bad configuration: %v\n", err)
		return exitConfig
	}
	if errors.Is(err, deliver.ErrReplicaMismatch) {
		// A live replica runs with another level table, prefix or
		// replica count: this one changed nothing and must not run.
		logger.Error("delayd cannot start: a live replica's configuration differs", slog.Any("error", err))
		fmt.Fprintf(os.Stderr, "delayd: bad configuration: %v\n", err)
		return exitConfig
	}
	if errors.Is(err, deliver.ErrIngressPartitionsChanged) {
		logger.Error("delayd cannot start: DELAYD_INGRESS_PARTITIONS changed while DELAYD_INGRESS holds messages", slog.Any("error", err))
		fmt.Fprintf(os.Stderr, "delayd: bad configuration: %v\n", err)
		return exitConfig
	}
	if errors.Is(err, deliver.ErrHopKey) {
		logger.Error("delayd cannot start: its hop secret in NATS is damaged", slog.Any("error", err))
		return exitError
	}
	logger.Error("delayd stopped with an error", slog.Any("error", err))
	return exitError
}

// unconfirmedOffsets names the level streams whose last offset write was not acknowledged, with the
// deliveries it covers ("DELAYD_1S:12"): after Run returned, the offsets its shutdown could not commit.
func unconfirmedOffsets(svc *deliver.Service) []string {
	_, scanners := svc.Stats()
	var out []string
	for _, sc := range scanners {
		if sc.CommitLag > 0 {
			out = append(out, fmt.Sprintf("%s:%d", sc.Stream, sc.CommitLag))
		}
	}
	return out
}

// errAttr is the "error" attribute for err, or no attribute when err is
// nil: nats.go's LastError is nil until an attempt has failed, and a log
// line should not read "error":null.
func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.Any("error", err)
}

// newLogger builds the tint (text) or JSON handler per DELAYD_LOG_FORMAT.
func newLogger(cfg config.Config) *slog.Logger {
	level := cfg.SlogLevel()
	format := strings.ToLower(cfg.LogFormat)
	if format == "auto" {
		format = "json"
		if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(tint.NewTextHandler(os.Stderr, &tint.Options{Level: level, TimeFormat: "15:04:05.000"}))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// delayd's connections ping the server every pingInterval and take the connection for stale (and reconnect) when
// maxPingsOut pings in a row go unanswered: 3 to 4 s after the server stopped answering, so that leaving a hung
// server, a lease's takeover and the work's start fit in the 5 s a hang may cost beyond JetStream's elections
// (docs/operations.md#what-each-failure-costs).
const (
	pingInterval = time.Second
	maxPingsOut  = 3
)

// connect dials NATS and reconnects for ever, with jittered backoff.
func connect(url string, cfg config.Config, logger *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name("delayd"),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		// No reconnect buffer: a publish while disconnected fails at once
		// (nats.ErrReconnectBufExceeded) instead of being sent after the
		// reconnect, when this process may no longer own the work
		// (docs/operations.md#several-replicas). Every publish path retries or redelivers.
		nats.ReconnectBufSize(-1),
		// A server that hangs (SIGSTOP, a stalled disk, a half-open network) keeps its socket open: without
		// pings answered, nats.go takes the connection for stale only after MaxPingsOut intervals (2 minutes by
		// default), and every request through it waits. With these, the connection is dropped within 3-4 s and
		// nats.go reconnects to the next server of its list (the hung one goes to the list's end),
		// docs/operations.md#what-each-failure-costs.
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		// A hung server stops reading: once the socket's buffer is full, a write blocks, holding the connection's
		// lock, and with it every publish and the pings (nats.go waits a minute by default). A write blocked this
		// long is a connection error: nats.go reconnects.
		nats.FlusherTimeout(pingInterval * maxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("disconnected from NATS", slog.Any("error", err))
			}
		}),
		nats.ConnectHandler(func(nc *nats.Conn) { logConnected(nc, cfg, logger) }),
	}, extra...)
	return nats.Connect(url, opts...)
}

// logConnected logs the server URL without its password or token, the authentication method's name and whether the
// connection is TLS; never an option value.
func logConnected(nc *nats.Conn, cfg config.Config, logger *slog.Logger) {
	_, tlsErr := nc.TLSConnectionState()
	logger.Info("connected to NATS", slog.String("url", config.RedactURLs(nc.ConnectedUrlRedacted())),
		slog.String("auth", cfg.AuthMethod()), slog.Bool("tls", tlsErr == nil))
}

// serveHTTP serves [newMux] and the console (/console/, on nc) on cfg.HTTPAddr. The console's actions need
// cfg.ConsoleToken, or without one a listener on a loopback address (docs/operations.md#the-console).
func serveHTTP(cfg config.HTTP, nc *nats.Conn, svc *deliver.Service, m *metrics.Metrics, logger *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, err
	}
	loopback := console.LoopbackAddr(ln.Addr())
	con, err := console.New(nc, console.Config{Token: string(cfg.ConsoleToken), Loopback: loopback, Logger: logger})
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	mux := newMux(svc, m)
	mux.Handle("/console/", con)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server failed", slog.Any("error", err))
		}
	}()
	logger.Info("http endpoints", slog.String("addr", ln.Addr().String()), slog.String("paths", "/healthz /readyz /metrics /console/"))
	actions := "refused (no DELAYD_CONSOLE_TOKEN and the listener is not loopback-only)"
	switch {
	case cfg.ConsoleToken != "":
		actions = "with DELAYD_CONSOLE_TOKEN"
	case loopback:
		actions = "from this host (loopback listener, no DELAYD_CONSOLE_TOKEN)"
	}
	logger.Info("console", slog.String("url", "http://"+ln.Addr().String()+"/console/"), slog.String("actions", actions))
	return hs, nil
}

// newMux serves /healthz (the process is alive), /readyz (200 "ready", or
// 503 "not ready: " and every reason of [deliver.Service.Unready], naming
// the stalled level streams or DELAYD_DLQ) and /metrics.
func newMux(svc *deliver.Service, m *metrics.Metrics) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := svc.Unready(); len(why) > 0 {
			http.Error(w, "not ready: "+strings.Join(why, "; "), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", m.Handler())
	return mux
}

// answerKeep is DELAYD_ANSWER_KEEP as [deliver.Config].AnswerKeep: 0
// ("off") is [deliver.AnswerKeepOff].
func answerKeep(keep config.OffDuration) time.Duration {
	if keep == 0 {
		return deliver.AnswerKeepOff
	}
	return time.Duration(keep)
}
