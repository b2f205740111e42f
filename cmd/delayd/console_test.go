package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/metrics"
)

// lockedBuffer is a bytes.Buffer safe for the logger and the test at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// record returns the attributes of the first JSON log line whose msg is msg; nil if none.
func (b *lockedBuffer) record(msg string) map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, line := range strings.Split(b.buf.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg {
			return r
		}
	}
	return nil
}

// TestServeHTTPConsole: DELAYD_HTTP_ADDR serves the console at /console/ beside /healthz, and delayd logs who may
// act: from this host on a loopback listener without a token, only with the token when one is set.
func TestServeHTTPConsole(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err := deliver.New(nc, deliver.Config{Levels: levels.MustParse("1s")})
	if err != nil {
		t.Fatal(err)
	}
	for token, actions := range map[string]string{"": "from this host", "0123456789abcdef-console": "with DELAYD_CONSOLE_TOKEN"} {
		var logs lockedBuffer
		logger := slog.New(slog.NewJSONHandler(&logs, nil))
		hs, err := serveHTTP(config.HTTP{HTTPAddr: "127.0.0.1:0", ConsoleToken: config.Secret(token)}, nc, svc, metrics.New(svc, nc), logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hs.Close() })
		con := logs.record("console")
		if con == nil || !strings.Contains(con["actions"].(string), actions) {
			t.Errorf("token %q: console log line %v, want actions %q", token, con, actions)
		}
		addr := logs.record("http endpoints")["addr"].(string)
		for path, want := range map[string]string{"/console/": "Level streams", "/console": "Level streams", "/healthz": "ok"} {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
				t.Errorf("GET %s: %d, want 200 with %q\n%s", path, resp.StatusCode, want, body)
			}
		}
	}
}
