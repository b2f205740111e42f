package main

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/delayd/delayd/config"
)

// startEmbedded starts a nats-server with JetStream on DELAYD_LISTEN, storing
// in DELAYD_STORE_DIR. It installs no signal handlers (delayd owns shutdown)
// and logs through delayd's logger.
//
// Before the server touches the store, it locks DELAYD_STORE_DIR (see
// [lockStore]) and checks that DELAYD_LISTEN is free: a second delayd on the
// same store fails at once, naming the variable and the holder's PID, and
// never starts JetStream on a store another server is using. The caller
// releases the returned lock after [shutdownEmbedded].
func startEmbedded(cfg config.Config, logger *slog.Logger) (*server.Server, *storeLock, error) {
	host, portText, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("DELAYD_LISTEN=%q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, nil, fmt.Errorf("DELAYD_LISTEN=%q: bad port: %w", cfg.Listen, err)
	}
	lock, err := lockStore(cfg.StoreDir)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		lock.Release()
		return nil, nil, fmt.Errorf("DELAYD_LISTEN=%q: cannot listen (another server on this address?): %w", cfg.Listen, err)
	}
	_ = ln.Close()
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		logger.Warn("embedded nats-server listens beyond loopback without authentication", slog.String("listen", cfg.Listen))
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "delayd",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
	})
	if err != nil {
		lock.Release()
		return nil, nil, err
	}
	srv.SetLoggerV2(&serverLogger{l: logger.With(slog.String("component", "nats-server"))}, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		lock.Release()
		return nil, nil, fmt.Errorf("not ready for connections on %s within 30s (is the port in use? DELAYD_LISTEN=%q)", cfg.Listen, cfg.Listen)
	}
	return srv, lock, nil
}

func shutdownEmbedded(srv *server.Server, logger *slog.Logger) {
	srv.Shutdown()
	srv.WaitForShutdown()
	logger.Debug("embedded nats-server stopped")
}

// serverLogger bridges nats-server's logger into slog. The server's notices
// (its start-up banner) are Debug, so delayd's own Info lines stay readable;
// warnings and errors keep their level.
type serverLogger struct{ l *slog.Logger }

func (s *serverLogger) Noticef(format string, v ...any) {
	s.l.Debug("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
func (s *serverLogger) Warnf(format string, v ...any) {
	s.l.Warn("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
func (s *serverLogger) Fatalf(format string, v ...any) {
	s.l.Error("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
func (s *serverLogger) Errorf(format string, v ...any) {
	s.l.Error("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
func (s *serverLogger) Debugf(format string, v ...any) {
	s.l.Debug("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
func (s *serverLogger) Tracef(format string, v ...any) {
	s.l.Debug("nats-server", slog.String("line", fmt.Sprintf(format, v...)))
}
