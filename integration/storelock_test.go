package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// embeddedProcess starts the delayd binary in embedded mode (no DELAYD_NATS_URL) on store and listen.
func embeddedProcess(t *testing.T, store, listen string) (*exec.Cmd, *itest.SyncWriter) {
	t.Helper()
	bin, err := itest.DelaydBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "DELAYD_STORE_DIR="+store, "DELAYD_LISTEN="+listen, "DELAYD_HTTP_ADDR=",
		"DELAYD_LEVELS=1s", "DELAYD_LOG_FORMAT=json", "DELAYD_LOG_LEVEL=warn")
	out := &itest.SyncWriter{W: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEmbeddedStoreLocked starts an embedded delayd on a store directory, then a second one on the same
// directory, once with the same DELAYD_LISTEN and once with another: the second exits with status 1 and an error
// naming DELAYD_STORE_DIR and the first one's PID, without starting its server, and the first keeps delivering.
func TestEmbeddedStoreLocked(t *testing.T) {
	t.Parallel()
	store, listen := t.TempDir(), freeAddr(t)
	first, firstOut := embeddedProcess(t, store, listen)

	var nc *nats.Conn
	itest.WaitFor(t, 60*time.Second, "the first delayd's server", func() bool {
		c, err := nats.Connect("nats://" + listen)
		if err != nil {
			return false
		}
		nc = c
		return true
	})
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	itest.WaitFor(t, 30*time.Second, "the first delayd's ingress stream", func() bool {
		_, err := js.Stream(ctx, deliver.IngressStream)
		return err == nil
	})

	for _, second := range []string{listen, freeAddr(t)} {
		cmd, out := embeddedProcess(t, store, second)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 {
				t.Errorf("second delayd (DELAYD_LISTEN=%s): %v, want exit status 1\n%s", second, err, out)
			}
		case <-ctx.Done():
			t.Fatalf("second delayd on the same DELAYD_STORE_DIR (DELAYD_LISTEN=%s) did not exit\n%s", second, out)
		}
		for _, want := range []string{"DELAYD_STORE_DIR", fmt.Sprintf("pid %d", first.Process.Pid), "store directory in use"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("second delayd's output lacks %q:\n%s", want, out)
			}
		}
	}

	// The first still works: a level-1 message published now is delivered.
	sub, err := nc.SubscribeSync("orders.after")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "delay.orders.after", Data: []byte("after"), Header: itest.Level(1)}); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(30 * time.Second); err != nil || string(m.Data) != "after" {
		t.Fatalf("first delayd after the second exited: %v, %v\n%s", m, err, firstOut)
	}
	for _, bad := range []string{"Critical write error", "panic"} {
		if strings.Contains(firstOut.String(), bad) {
			t.Errorf("first delayd logged %q:\n%s", bad, firstOut)
		}
	}
}
