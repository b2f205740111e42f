package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/config"
)

// TestConnectStaleAfterUnansweredPings: a server that hangs keeps its
// socket open and answers nothing. delayd's connection must take it for
// stale (nats.ErrStaleConnection, and reconnect) once 3 pings in a row go
// unanswered (a ping a second: 3 to 4 s, docs/operations.md), not wait
// for the server. The "server" here answers the connect's handshake, then
// nothing; it counts the pings it reads until the client drops the
// connection.
func TestConnectStaleAfterUnansweredPings(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unanswered := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		ln.Close() // one connection: a reconnect finds no server
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "INFO {\"server_id\":\"hung\",\"version\":\"2.15.2\",\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n")
		r := bufio.NewReader(c)
		handshake, n := true, 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				unanswered <- n // the client dropped the connection
				return
			}
			if !strings.HasPrefix(line, "PING") {
				continue
			}
			if handshake {
				handshake = false
				_, _ = c.Write([]byte("PONG\r\n"))
				continue
			}
			n++
		}
	}()
	dropped := make(chan error, 1)
	nc, err := connect("nats://"+ln.Addr().String(), config.Config{}, slog.New(slog.DiscardHandler),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			select {
			case dropped <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.Opts.PingInterval; got != time.Second {
		t.Errorf("PingInterval %s, want 1s", got)
	}
	if got := nc.Opts.FlusherTimeout; got != 3*time.Second {
		t.Errorf("FlusherTimeout %s, want 3s (a write blocked on a hung server's full socket)", got)
	}
	select {
	case err := <-dropped:
		if !errors.Is(err, nats.ErrStaleConnection) {
			t.Errorf("connection dropped with %v, want nats.ErrStaleConnection", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the connection to a server answering nothing was not dropped within a minute")
	}
	select {
	case n := <-unanswered:
		if n != 3 {
			t.Errorf("the connection was dropped after %d unanswered pings, want 3", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("the hung server never saw its connection dropped")
	}
}
