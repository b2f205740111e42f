package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/metrics"
)

// readyz gets /readyz and returns its status and body.
func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestReadyzStalledLevel is the stall repro: a target stream at its limits
// (max_msgs 1, discard new, already holding one message) and one message due
// to it at level 1. The scanner retries it all along, but a retry is not
// progress: /readyz answers 503 naming the level stream once the due head has
// not been handed off for 30 s (not before), and 200 again once the target
// has room, when the message is delivered once.
func TestReadyzStalledLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 30 s stall threshold: skipped when testing.Short()")
	}
	srv := natstest.Start(t, nil)
	ctx := context.Background()
	tnc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tnc.Close)
	tjs, err := jetstream.New(tnc)
	if err != nil {
		t.Fatal(err)
	}
	full, err := tjs.CreateStream(ctx, jetstream.StreamConfig{
		Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tjs.Publish(ctx, "full.before", []byte("already here")); err != nil {
		t.Fatal(err)
	}

	var svc *deliver.Service
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { svc.HandleAsyncError(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err = deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("1s 5s")})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	hs := httptest.NewServer(newMux(svc, metrics.New(svc, nc)))
	t.Cleanup(hs.Close)

	deadline := time.Now().Add(20 * time.Second)
	for code, _ := readyz(t, hs.URL); code != http.StatusOK; code, _ = readyz(t, hs.URL) {
		if time.Now().After(deadline) {
			t.Fatal("not ready within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	if _, err := tjs.PublishMsg(ctx, &nats.Msg{Subject: "delay.full.x", Data: []byte("due"), Header: nats.Header{"Delay-Level": {"1"}}}); err != nil {
		t.Fatal(err)
	}
	// The due time, from the level message's Delay-Due-At.
	var due time.Time
	deadline = time.Now().Add(10 * time.Second)
	for due.IsZero() {
		if m, err := tjs.Stream(ctx, "DELAYD_1S"); err == nil {
			// By subject: the stream also holds the router's epoch marker.
			if raw, err := m.GetLastMsgForSubject(ctx, "delayd.level.1S.full.x"); err == nil {
				if due, err = time.Parse(time.RFC3339Nano, raw.Header.Get(contract.HeaderDueAt)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the message did not reach DELAYD_1S within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// 200 until 30 s past due; 503 naming DELAYD_1S by 35 s past due.
	var stalledAt time.Time
	for stalledAt.IsZero() {
		code, body := readyz(t, hs.URL)
		now := time.Now()
		switch {
		case code == http.StatusServiceUnavailable && now.Sub(due) < deliver.ScannerStallAfterDefault:
			t.Fatalf("503 %q only %s after due, before the %s threshold", body, now.Sub(due), deliver.ScannerStallAfterDefault)
		case code == http.StatusServiceUnavailable:
			if !strings.Contains(body, "DELAYD_1S") {
				t.Fatalf("503 body %q does not name the stalled level stream DELAYD_1S", body)
			}
			stalledAt = now
			t.Logf("503 %s after due: %q", now.Sub(due).Round(time.Millisecond), strings.TrimSpace(body))
		case code != http.StatusOK:
			t.Fatalf("/readyz answered %d %q", code, body)
		case now.Sub(due) > 35*time.Second:
			t.Fatalf("still 200 %s after due: the failing level was never reported stalled", now.Sub(due))
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, ss := svc.Stats()
	for _, s := range ss {
		if s.Stream == "DELAYD_1S" && s.Retries < 2 {
			t.Errorf("DELAYD_1S retried %d times: the stall must come from a head that is retried, not left alone", s.Retries)
		}
	}

	// The target frees: delivered, and ready again.
	if err := full.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for code, body := readyz(t, hs.URL); code != http.StatusOK; code, body = readyz(t, hs.URL) {
		if time.Now().After(deadline) {
			t.Fatalf("still %d %q 20s after the target freed", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := full.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("FULL holds %d messages after the purge, want the one delivery", info.State.Msgs)
	}
	m, err := full.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "full.x" || string(m.Data) != "due" {
		t.Fatalf("FULL holds %s %q, want full.x \"due\"", m.Subject, m.Data)
	}
}

// TestHealthzReadyz: /healthz answers 200 while the process serves, whatever
// the service's state; /readyz answers 503 with the reason before the
// service has set up, 200 "ready" once it runs, and 503 naming the
// connection once the NATS server is gone.
func TestHealthzReadyz(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err := deliver.New(nc, deliver.Config{Levels: levels.MustParse("1s")})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(newMux(svc, metrics.New(svc, nc)))
	t.Cleanup(hs.Close)
	healthz := func() (int, string) {
		t.Helper()
		resp, err := http.Get(hs.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	waitReadyz := func(want int, wantBody string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body := readyz(t, hs.URL)
			if code == want && strings.Contains(body, wantBody) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz %d %q, want %d with %q", code, body, want, wantBody)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if code, body := healthz(); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz before Run: %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, body := readyz(t, hs.URL); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: ") {
		t.Errorf("/readyz before Run: %d %q, want 503 \"not ready: ...\"", code, body)
	}

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	waitReadyz(http.StatusOK, "ready\n")

	srv.Shutdown()
	waitReadyz(http.StatusServiceUnavailable, "NATS connection down")
	if code, _ := healthz(); code != http.StatusOK {
		t.Errorf("/healthz with the server gone: %d, want 200 (the process is alive)", code)
	}
}

// TestReadyzWithoutLeases: of two delayd services on one server, the one
// started first holds every lease (the router, the janitor, each level
// stream); the second is ready (/readyz 200) on both from the moment it
// bids, whatever it holds, and the first then hands half of the leases
// over. /metrics says who holds what: each lease is held (delayd_lease_held
// 1) by exactly one of them, and both count two live replicas and a share
// of half the leases.
func TestReadyzWithoutLeases(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	type replica struct {
		svc *deliver.Service
		url string
	}
	start := func() replica {
		t.Helper()
		nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		svc, err := deliver.New(nc, deliver.Config{Levels: levels.MustParse("1s")})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(newMux(svc, metrics.New(svc, nc)))
		t.Cleanup(hs.Close)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Run(ctx) }()
		t.Cleanup(func() {
			stop()
			<-done
		})
		return replica{svc, hs.URL}
	}
	holds := func(r replica) (held, all int) {
		for _, l := range r.svc.Leases() {
			all++
			if l.Held {
				held++
			}
		}
		return held, all
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	first := start()
	waitUntil("the first service holds every lease", func() bool { h, n := holds(first); return n > 0 && h == n })
	second := start()
	// Its leases are listed a moment before its set-up ends (the cancel
	// and info subscriptions): wait for the end of "starting", not for the
	// list. Whatever it holds then, it must be ready.
	waitUntil("the second service bids and is set up", func() bool {
		_, n := holds(second)
		return n > 0 && !slices.Contains(second.svc.Unready(), "starting: resources not set up yet")
	})
	for _, r := range []replica{first, second} {
		if code, body := readyz(t, r.url); code != http.StatusOK || body != "ready\n" {
			t.Errorf("/readyz: %d %q, want 200 \"ready\\n\"", code, body)
		}
	}
	_, n := holds(first)
	share := (n + 1) / 2
	waitUntil("the leases shared", func() bool {
		h1, _ := holds(first)
		h2, _ := holds(second)
		return h1 == share && h2 == n-share
	})
	scrape := func(url string) string {
		t.Helper()
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	m1, m2 := scrape(first.url), scrape(second.url)
	for _, l := range first.svc.Leases() {
		v1, v2 := "0", "1"
		if l.Held {
			v1, v2 = "1", "0"
		}
		for _, c := range []struct{ name, metrics, want string }{{"first", m1, v1}, {"second", m2, v2}} {
			if want := fmt.Sprintf("delayd_lease_held{lease=%q} %s", l.Key, c.want); !strings.Contains(c.metrics, want) {
				t.Errorf("%s service's /metrics lacks %s", c.name, want)
			}
		}
	}
	for _, want := range []string{"delayd_replicas_live 2", fmt.Sprintf("delayd_lease_share %d", share), `delayd_failovers_total{lease="router"} 0`} {
		for name, m := range map[string]string{"first": m1, "second": m2} {
			if !strings.Contains(m, want) {
				t.Errorf("%s service's /metrics lacks %s", name, want)
			}
		}
	}
}

// TestConnectNoReconnectBuffer: delayd's connection buffers nothing while
// disconnected: a publish made while the server is gone fails at once
// with nats.ErrReconnectBufExceeded, so nothing a replica published while
// cut off (and possibly no longer owning its work) is sent after the
// reconnect (docs/operations.md#several-replicas).
func TestConnectNoReconnectBuffer(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc, err := connect(srv.ClientURL(), config.Config{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("x", []byte("connected")); err != nil {
		t.Fatalf("publish while connected: %v", err)
	}
	srv.Shutdown()
	deadline := time.Now().Add(20 * time.Second)
	for nc.IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("still connected 20 s after the server shut down")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := nc.Publish("x", []byte("disconnected")); !errors.Is(err, nats.ErrReconnectBufExceeded) {
		t.Fatalf("publish while disconnected: %v, want nats.ErrReconnectBufExceeded (not buffered)", err)
	}
}
