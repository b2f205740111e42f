package console_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/console"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// hostile is published as an id, a header value and a payload: a page that shows it as markup runs its script.
const hostile = `<img src=x onerror=alert(1)>`

const target = "orders.close"

type testBundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	con *console.Console
	srv *httptest.Server
}

// setup starts a nats-server, a real delayd (deliver.Service with its stats API) and the console with cfg behind
// an httptest server.
func setup(t *testing.T, cfg console.Config) *testBundle {
	t.Helper()
	nc, js := natstest.Connect(t)
	svc, err := deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("1s 1h"), LeaseTTL: 15 * time.Second, CancelLookupShare: 1})
	if err != nil {
		t.Fatal(err)
	}
	stopStats, err := svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = stopStats() })
	waitFor(t, "the service ready", svc.Ready)
	con, err := console.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	return &testBundle{nc: nc, js: js, con: con, srv: srv}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
	}
}

// publish publishes a message due in an hour with id, the hostile header and payload, and waits until the list
// API lists it.
func (b *testBundle) publish(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := delayd.Publish(ctx, b.js, target, []byte("payload "+hostile), delayd.WithDuration(time.Hour), delayd.WithMsgID(id),
		delayd.WithHeader(nats.Header{"X-Note": {hostile}})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message listed", func() bool {
		p, err := delayd.ListPending(ctx, b.nc, target)
		if err != nil {
			return false
		}
		for _, m := range p.Items {
			if m.ID == id {
				return true
			}
		}
		return false
	})
}

func (b *testBundle) state(t *testing.T, id string) delayd.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := delayd.Status(ctx, b.nc, target, id)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

// client is a browser: a cookie jar, and an optional bearer token on every request.
type client struct {
	t     *testing.T
	base  string
	hc    *http.Client
	token string
}

func (b *testBundle) client(t *testing.T, token string) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: b.srv.URL, hc: &http.Client{Jar: jar}, token: token}
}

func (c *client) do(req *http.Request) (int, string) {
	c.t.Helper()
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (c *client) get(path string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	return c.do(req)
}

func (c *client) post(path string, form url.Values, hdr http.Header) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf loads the message page and returns its forms' CSRF token (its cookie is in the jar).
func (c *client) csrf(id string) string {
	c.t.Helper()
	code, body := c.get("/console/message?" + url.Values{"subject": {target}, "id": {id}}.Encode())
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		c.t.Fatalf("message page: %d, no CSRF token:\n%s", code, body)
	}
	return m[1]
}

func actionForm(csrf, id string) url.Values {
	return url.Values{"csrf": {csrf}, "subject": {target}, "id": {id}}
}

// TestPagesEscape: the overview, target and message pages render, and the hostile id, header and payload appear
// as text (escaped), never as markup.
func TestPagesEscape(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Loopback: true})
	id := "id-" + hostile
	b.publish(t, id)
	c := b.client(t, "")
	escaped := `&lt;img src=x onerror=alert(1)&gt;`

	code, body := c.get("/console/")
	if code != http.StatusOK || !strings.Contains(body, "DELAYD_1H") || !strings.Contains(body, "Dead letters") {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	code, body = c.get("/console/target?subject=" + target)
	if code != http.StatusOK || !strings.Contains(body, "<svg") || !strings.Contains(body, "id-"+escaped) {
		t.Errorf("target page: %d, want the histogram and the id escaped\n%s", code, body)
	}
	code, body = c.get("/console/message?" + url.Values{"subject": {target}, "id": {id}, "payload": {"1"}}.Encode())
	if code != http.StatusOK || !strings.Contains(body, "X-Note") || strings.Count(body, escaped) < 3 {
		t.Errorf("message page: %d, want the id, the X-Note header and the payload, each escaped\n%s", code, body)
	}
	for _, page := range []string{"/console/", "/console/target?subject=" + target, "/console/message?" + url.Values{"subject": {target}, "id": {id}, "payload": {"1"}}.Encode()} {
		if _, body := c.get(page); strings.Contains(body, hostile) {
			t.Errorf("%s shows the hostile value as markup:\n%s", page, body)
		}
	}
}

// TestSequenceID: a message published without a Nats-Msg-Id is listed by its ingress sequence ("seq:<n>"), and the
// target page links to its detail page, which finds it.
func TestSequenceID(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Loopback: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := delayd.Publish(ctx, b.js, target, []byte("no id"), delayd.WithDuration(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var id string
	waitFor(t, "the message listed", func() bool {
		p, err := delayd.ListPending(ctx, b.nc, target)
		if err == nil && len(p.Items) == 1 {
			id = p.Items[0].ID
		}
		return id != ""
	})
	c := b.client(t, "")
	if _, body := c.get("/console/target?subject=" + target); !strings.Contains(strings.ToLower(body), strings.ToLower("id="+url.QueryEscape(id))) {
		t.Errorf("target page: no link to %s\n%s", id, body)
	}
	code, body := c.get("/console/message?" + url.Values{"subject": {target}, "id": {id}, "payload": {"1"}}.Encode())
	if code != http.StatusOK || !strings.Contains(body, "state: <b>pending</b>") || !strings.Contains(body, "<pre>no id</pre>") {
		t.Errorf("message page of %s: %d\n%s", id, code, body)
	}
}

// TestActionNeedsToken: with DELAYD_CONSOLE_TOKEN set and a listener that is not loopback-only, a cancel without
// the token is refused (403) and the message stays pending; with the bearer token, or after logging in, it is
// cancelled (the status API says so).
func TestActionNeedsToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-console"
	var logs syncBuffer
	b := setup(t, console.Config{Token: token, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	b.publish(t, "m1")
	b.publish(t, "m2")

	anon := b.client(t, "")
	if code, body := anon.post("/console/cancel", actionForm(anon.csrf("m1"), "m1"), nil); code != http.StatusForbidden || !strings.Contains(body, "DELAYD_CONSOLE_TOKEN") {
		t.Errorf("cancel without the token: %d, want 403\n%s", code, body)
	}
	wrong := b.client(t, "not-the-token-at-all")
	if code, _ := wrong.post("/console/cancel", actionForm(wrong.csrf("m1"), "m1"), nil); code != http.StatusForbidden {
		t.Errorf("cancel with a wrong token: %d, want 403", code)
	}
	if st := b.state(t, "m1"); st != delayd.Pending {
		t.Fatalf("m1 after refused cancels: %s, want pending", st)
	}
	bearer := b.client(t, token)
	if code, body := bearer.post("/console/cancel", actionForm(bearer.csrf("m1"), "m1"), nil); code != http.StatusOK || !strings.Contains(body, "cancelled") {
		t.Errorf("cancel with the bearer token: %d\n%s", code, body)
	}
	if st := b.state(t, "m1"); st != delayd.StateCancelled {
		t.Errorf("m1 after the cancel: %s, want cancelled", st)
	}
	if got := logs.String(); !strings.Contains(got, `"msg":"console action","action":"cancel","target":"orders.close","id":"m1","answer":"cancelled","by":{"auth":"bearer token","remote":"127.0.0.1:`) ||
		!strings.Contains(got, `"msg":"console action refused","path":"/console/cancel","why":"not authenticated"`) {
		t.Errorf("action log: want the cancel with its answer and who, and the refusal:\n%s", got)
	}

	login := b.client(t, "")
	csrf := login.csrf("m2")
	if code, _ := login.post("/console/login", url.Values{"csrf": {csrf}, "token": {"wrong-token-0123456"}}, nil); code != http.StatusForbidden {
		t.Errorf("login with a wrong token: %d, want 403", code)
	}
	if code, _ := login.post("/console/login", url.Values{"csrf": {csrf}, "token": {token}}, nil); code != http.StatusOK {
		t.Errorf("login: %d, want the overview after the redirect", code)
	}
	if code, body := login.post("/console/cancel", actionForm(csrf, "m2"), nil); code != http.StatusOK || !strings.Contains(body, "cancelled") {
		t.Errorf("cancel after login: %d\n%s", code, body)
	}
	if st := b.state(t, "m2"); st != delayd.StateCancelled {
		t.Errorf("m2 after the cancel: %s, want cancelled", st)
	}
}

// TestActionCSRF: an authenticated action without the CSRF token, with a form field that differs from the cookie
// (another browser's token, signed by this console, or the cookie's token altered), or with a forged token in
// both is refused (403), and the message stays pending.
func TestActionCSRF(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-console"
	b := setup(t, console.Config{Token: token})
	b.publish(t, "m1")
	c := b.client(t, token)
	good := c.csrf("m1")
	// Another browser's token: signed by this console, but not c's cookie.
	other := b.client(t, token).csrf("m1")
	if other == good {
		t.Fatal("two browsers were given the same CSRF token")
	}
	// good with its last character changed: neither c's cookie nor signed.
	last := "0"
	if strings.HasSuffix(good, last) {
		last = "1"
	}
	forged := strings.Repeat("a", 32) + "." + strings.Repeat("b", 64)
	for name, form := range map[string]url.Values{
		"no field":                 {"subject": {target}, "id": {"m1"}},
		"field not cookie":         actionForm(other, "m1"),
		"field not cookie, forged": actionForm(good[:len(good)-1]+last, "m1"),
	} {
		if code, body := c.post("/console/cancel", form, nil); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
			t.Errorf("%s: %d, want 403\n%s", name, code, body)
		}
	}
	// A forged token in both the cookie and the field (a double-submit an attacker could plant): not signed.
	fresh := b.client(t, token)
	if code, _ := fresh.post("/console/cancel", actionForm(forged, "m1"), http.Header{"Cookie": {"delayd_console_csrf=" + forged}}); code != http.StatusForbidden {
		t.Errorf("forged token: %d, want 403", code)
	}
	if st := b.state(t, "m1"); st != delayd.Pending {
		t.Errorf("m1 after refused cancels: %s, want pending", st)
	}
}

// TestLoopback: without a token, a loopback-only listener allows actions from this host, but not a request a
// proxy forwarded; a listener that is not loopback-only refuses them all.
func TestLoopback(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Loopback: true})
	b.publish(t, "m1")
	c := b.client(t, "")
	csrf := c.csrf("m1")
	if code, _ := c.get("/console/cancel?" + actionForm(csrf, "m1").Encode()); code != http.StatusMethodNotAllowed {
		t.Errorf("GET cancel: %d, want 405 (actions are POST only)", code)
	}
	if code, _ := c.post("/console/cancel", actionForm(csrf, "m1"), http.Header{"X-Forwarded-For": {"203.0.113.9"}}); code != http.StatusForbidden {
		t.Errorf("forwarded cancel: %d, want 403", code)
	}
	// A DNS-rebinding page reaches the loopback listener under its own host name.
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/console/cancel", strings.NewReader(actionForm(csrf, "m1").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Host = "attacker.example:80"
	req.Header.Set("Cookie", "delayd_console_csrf="+csrf) // the jar keeps cookies by the URL's host, not Host
	if code, _ := c.do(req); code != http.StatusForbidden {
		t.Errorf("cancel with Host %s: %d, want 403", req.Host, code)
	}
	if st := b.state(t, "m1"); st != delayd.Pending {
		t.Fatalf("m1 after a refused cancel: %s, want pending", st)
	}
	if code, body := c.post("/console/cancel", actionForm(csrf, "m1"), nil); code != http.StatusOK || !strings.Contains(body, "cancelled") {
		t.Errorf("local cancel: %d\n%s", code, body)
	}
	if st := b.state(t, "m1"); st != delayd.StateCancelled {
		t.Errorf("m1 after the cancel: %s, want cancelled", st)
	}
}

// TestRescheduleAnswer: reschedule, then run now (in that order: after a run now the message is delivered), each
// show delayd's answer, rescheduled; a third run now shows already delivered, not success.
func TestRescheduleAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Loopback: true})
	b.publish(t, "m1")
	c := b.client(t, "")
	csrf := c.csrf("m1")
	steps := []struct {
		path  string
		extra url.Values
	}{{"/console/reschedule", url.Values{"in": {"2h"}}}, {"/console/runnow", nil}}
	for _, st := range steps {
		form := actionForm(csrf, "m1")
		for k, v := range st.extra {
			form[k] = v
		}
		if code, body := c.post(st.path, form, nil); code != http.StatusOK || !strings.Contains(body, "rescheduled") {
			t.Errorf("%s: %d, want rescheduled\n%s", st.path, code, body)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for b.state(t, "m1") != delayd.StateDelivered && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	code, body := c.post("/console/runnow", actionForm(csrf, "m1"), nil)
	if !strings.Contains(body, "already delivered") || strings.Contains(body, "rescheduled") {
		t.Errorf("run now after the delivery: %d, want already delivered\n%s", code, body)
	}
}

// TestLoopbackAddr: only a loopback IP is a loopback-only listener; the unspecified addresses listen everywhere.
func TestLoopbackAddr(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:8223": true, "127.0.0.2:1": true, "[::1]:8223": true,
		"0.0.0.0:8223": false, "[::]:8223": false, "10.0.0.1:8223": false} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := console.LoopbackAddr(a); got != want {
			t.Errorf("LoopbackAddr(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestOverview: the overview counts what was published: the 1h level's two pending messages (none due, its head's
// due first), the 1s level's message once due there or delivered, its owner, the router, the replica, and a dead
// letter by its reason.
func TestOverview(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Loopback: true})
	b.publish(t, "a")
	b.publish(t, "b")
	if err := b.nc.Publish("delay.orders.nolevel", []byte("no delay header")); err != nil { // dead-lettered: reason level
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("overview not as published within 60 s: %s", last)
		}
		o := b.con.ReadOverview(ctx)
		found := false
		for _, l := range o.Levels {
			if l.Stream == "DELAYD_1H" {
				found = l.Pending == 2 && l.DueNow == 0 && !l.NextDue.IsZero() && l.Owner != ""
				last = fmt.Sprintf("%+v", l)
			}
		}
		dl := len(o.DeadLetters) == 1 && o.DeadLetters[0].Reason == "level" && o.DeadLetters[0].Count == 1 && o.DLQTotal == 1
		targets := len(o.Targets) == 1 && o.Targets[0] == struct {
			Target string
			Count  int
		}{target, 2}
		ok := found && dl && targets && len(o.Routers) == 1 && o.Routers[0].Owner != "" && len(o.Replicas) == 1 && len(o.Errors) == 0
		if !ok {
			last = fmt.Sprintf("1h %s; targets %+v; dead letters %+v (%d); routers %+v; replicas %d; errors %q", last, o.Targets, o.DeadLetters, o.DLQTotal, o.Routers, len(o.Replicas), o.Errors)
		}
		if ok {
			break
		}
	}
	first, err := delayd.ListPending(ctx, b.nc, target, delayd.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range b.con.ReadOverview(ctx).Levels {
		if l.Stream == "DELAYD_1H" && !l.NextDue.Equal(first.Items[0].Due) {
			t.Errorf("DELAYD_1H next due %v, want the first pending message's due %v (%s)", l.NextDue, first.Items[0].Due, last)
		}
	}
	// A cancelled message is not pending: its owner reports it cancelled.
	if res, err := delayd.Cancel(ctx, b.nc, target, "a"); err != nil || res != delayd.Cancelled {
		t.Fatalf("cancel a: %v, %v", res, err)
	}
	waitFor(t, "DELAYD_1H with 1 pending and 1 cancelled", func() bool {
		for _, l := range b.con.ReadOverview(ctx).Levels {
			if l.Stream == "DELAYD_1H" {
				return l.Pending == 1 && l.Cancelled == 1
			}
		}
		return false
	})
}

// syncBuffer is a bytes.Buffer the console's logger and the test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
