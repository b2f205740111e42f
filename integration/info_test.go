package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestInfoAPI: as soon as delayd reports ready, delayd.api.info answers
// with its configuration: prefix, level table and precision levels, max
// delay, target policy, the server's max payload and delayd's header
// reserve, and a version.
func TestInfoAPI(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s", func(c *deliver.Config) {
		c.Prefix = "sched"
		c.MaxDelay = 5 * time.Hour
		c.Targets = contract.TargetPolicy{Allow: []string{"orders.>"}, Deny: []string{"orders.internal.>"}}
	})
	m, err := b.NC.Request(contract.InfoSubject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("info request once delayd is ready: %v", err)
	}
	var info contract.InfoReply
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatalf("info reply %s: %v", m.Data, err)
	}
	want := []contract.InfoLevel{
		{Level: 1, Delay: "100ms", DelayNS: int64(100 * time.Millisecond), Stream: "DELAYD_100MS"},
		{Level: 2, Delay: "1s", DelayNS: int64(time.Second), Stream: "DELAYD_1S"},
	}
	if !slices.Equal(info.Levels, want) {
		t.Errorf("levels %+v, want %+v", info.Levels, want)
	}
	var precision []string
	for i, l := range info.PrecisionLevels {
		if l.Level != 3+i {
			t.Errorf("precision level %d has index %d", i, l.Level)
		}
		precision = append(precision, l.Delay)
	}
	if got := strings.Join(precision, " "); got != "1ms 2ms 4ms 8ms 16ms 32ms 64ms" {
		t.Errorf("precision levels %q, want 1ms ... 64ms", got)
	}
	switch {
	case info.Prefix != "sched":
		t.Errorf("prefix %q, want sched", info.Prefix)
	case info.MaxDelay != "5h0m0s" || info.MaxDelayNS != int64(5*time.Hour):
		t.Errorf("max delay %q (%d ns), want 5h0m0s", info.MaxDelay, info.MaxDelayNS)
	case !slices.Equal(info.AllowTargets, []string{"orders.>"}) || !slices.Equal(info.DenyTargets, []string{"orders.internal.>"}):
		t.Errorf("targets allow %q deny %q", info.AllowTargets, info.DenyTargets)
	case info.MaxPayload != b.NC.MaxPayload() || info.HeaderReserve != contract.HeaderReserve:
		t.Errorf("max payload %d, header reserve %d; want %d and %d", info.MaxPayload, info.HeaderReserve, b.NC.MaxPayload(), contract.HeaderReserve)
	case info.Version == "":
		t.Error("no version")
	}
	// The same through the client, and the defaults: max delay a week, no policy.
	b2 := itest.Setup(t)
	b2.StartDelayd("1s")
	got, err := delayd.FetchInfo(context.Background(), b2.NC)
	if err != nil {
		t.Fatal(err)
	}
	if got.Prefix != "delay" || got.MaxDelay != "168h0m0s" || len(got.AllowTargets)+len(got.DenyTargets) != 0 || len(got.Levels) != 1 {
		t.Errorf("default info %+v", got)
	}
}

// TestPublishLimits: delayd.Publish agrees with the running delayd on every
// limit of its configuration: a delay beyond its max delay, a target its
// policy denies, another prefix and a message too large are refused before
// anything reaches ingress; a level above the table is accepted and
// delivered at the highest level (delayd clamps), and a message at exactly
// the client's size limit that cascades with an id and a merge key is
// delivered, not dead-lettered. With no delayd, Publish still publishes
// unless WithRequireInfo.
func TestPublishLimits(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 200ms", func(c *deliver.Config) {
		c.MaxDelay = time.Hour
		c.Targets = contract.TargetPolicy{Deny: []string{"blocked.>"}}
	})
	var (
		mu      sync.Mutex
		ingress []string // subject and Nats-Msg-Id of every publish that reaches the ingress subjects
	)
	if _, err := b.NC.Subscribe("delay.>", func(m *nats.Msg) {
		mu.Lock()
		ingress = append(ingress, m.Subject+" "+m.Header.Get("Nats-Msg-Id"))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	_ = b.NC.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	limit := int(b.NC.MaxPayload()) - contract.HeaderReserve
	for _, c := range []struct {
		what    string
		subject string
		data    []byte
		opts    []delayd.PublishOpt
		want    error
	}{
		{"a duration beyond the max delay", "orders.x", nil, []delayd.PublishOpt{delayd.WithDuration(time.Hour + time.Second)}, delayd.ErrInvalidDelay},
		{"a deliver-at beyond the max delay", "orders.x", nil, []delayd.PublishOpt{delayd.WithDeliverAt(time.Now().Add(2 * time.Hour))}, delayd.ErrInvalidDelay},
		{"a denied target", "blocked.x", nil, []delayd.PublishOpt{delayd.WithLevel(1)}, contract.ErrDeniedTarget},
		{"another prefix", "orders.x", nil, []delayd.PublishOpt{delayd.WithLevel(1), delayd.WithPrefix("sched")}, delayd.ErrPrefixMismatch},
		{"too large", "orders.x", make([]byte, limit), []delayd.PublishOpt{delayd.WithLevel(1)}, delayd.ErrTooLarge},
	} {
		if _, err := delayd.Publish(ctx, b.JS, c.subject, c.data, c.opts...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		} else {
			t.Logf("%s: %v", c.what, err)
		}
	}

	got := b.Collect("orders.>")
	if _, err := delayd.Publish(ctx, b.JS, "orders.clamped", []byte("clamped"), delayd.WithLevel(9)); err != nil {
		t.Fatalf("level above the table: %v", err)
	}
	if _, err := delayd.Publish(ctx, b.JS, "orders.max", nil, delayd.WithDuration(time.Hour)); err != nil {
		t.Fatalf("a duration of exactly the max delay: %v", err)
	}
	// Exactly at the client's limit: headers and payload take limit bytes. A
	// long id and merge key (delayd copies them into its own headers), and a
	// duration that cascades through levels and precision levels (the most
	// headers delayd adds).
	hdr := nats.Header{"Tenant": []string{"acme"}}
	id1, id2 := "big-1-"+strings.Repeat("i", 300), "big-2-"+strings.Repeat("i", 300)
	fixed := len("NATS/1.0\r\n\r\n") + len("Tenant: acme\r\n") + len("Delay-Duration: 350ms\r\n") +
		2*len("Delay-Merge-Key: \r\n") + 2*len(id1)
	big := bytes.Repeat([]byte("b"), limit-fixed+len("Delay-Merge-Key")-len("Nats-Msg-Id"))
	if _, err := delayd.Publish(ctx, b.JS, "orders.big", big, delayd.WithDuration(350*time.Millisecond),
		delayd.WithMsgID(id1), delayd.WithMergeKey(id1), delayd.WithHeader(hdr)); err != nil {
		t.Fatalf("a message at the size limit: %v", err)
	}
	if _, err := delayd.Publish(ctx, b.JS, "orders.big", append(big, 'x'), delayd.WithDuration(350*time.Millisecond),
		delayd.WithMsgID(id2), delayd.WithMergeKey(id2), delayd.WithHeader(hdr)); !errors.Is(err, delayd.ErrTooLarge) {
		t.Errorf("a message one byte over the size limit: %v, want ErrTooLarge", err)
	}
	msgs := got.Wait(t, 2, 30*time.Second)
	for _, r := range msgs {
		switch r.Msg.Subject {
		case "orders.clamped":
			if d := parseTime(t, r.Msg.Header, "Delay-Due-At").Sub(parseTime(t, r.Msg.Header, "Delay-Enqueued-At")); d != 200*time.Millisecond {
				t.Errorf("level 9 delivered after %s, want the highest level's 200ms", d)
			}
		case "orders.big":
			if len(r.Msg.Data) != len(big) {
				t.Errorf("big message delivered with %d bytes, want %d", len(r.Msg.Data), len(big))
			}
		default:
			t.Errorf("unexpected delivery on %s", r.Msg.Subject)
		}
	}
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		for _, m := range b.StreamMsgs(deliver.DLQStream) {
			t.Logf("dead letter: %s %s", m.Header.Get(contract.HeaderSubject), m.Header.Get(contract.HeaderError))
		}
		t.Errorf("%d dead letters, want none: the client accepted a message delayd refused", n)
	}
	// The accepted publishes reached ingress (and the cascade's hops); no refused one did.
	itest.WaitFor(t, 10*time.Second, "ingress publishes seen", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ingress) >= 3
	})
	mu.Lock()
	for _, in := range ingress {
		if strings.HasPrefix(in, "delay.orders.x ") || strings.HasPrefix(in, "delay.blocked.x ") || strings.HasSuffix(in, " "+id2) {
			t.Errorf("a refused message reached ingress: %s", in)
		}
	}
	mu.Unlock()

	// No delayd: the config-independent checks only, unless WithRequireInfo.
	b.StopDelayd()
	nc, err := nats.Connect(b.Srv.ClientURL()) // a new connection: no cached info
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.down", nil, delayd.WithDuration(2*time.Hour), delayd.WithRequireInfo()); !errors.Is(err, delayd.ErrNoInfo) {
		t.Errorf("WithRequireInfo and no delayd: %v, want ErrNoInfo", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.down", nil, delayd.WithLevel(1)); err != nil {
		t.Errorf("publish while delayd is down: %v, want it stored in the ingress stream", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.*", nil, delayd.WithLevel(1)); !errors.Is(err, contract.ErrInvalidTarget) {
		t.Errorf("wildcard target while delayd is down: %v, want ErrInvalidTarget", err)
	}
	// Counted by subject: the ingress stream is a work queue, and a message
	// the stopped router had fetched but not yet acked (at-least-once; the
	// next router routes it) may still be there beside it.
	itest.WaitFor(t, 10*time.Second, "orders.down stored in the ingress stream", func() bool {
		n := 0
		for _, m := range b.StreamMsgs(deliver.IngressStream) {
			switch { // the subject as published, or under a partition transform
			case strings.HasSuffix(m.Subject, ".orders.down"):
				n++
			case strings.HasSuffix(m.Subject, ".orders.*"):
				t.Fatalf("a refused wildcard target was stored in the ingress stream: %s", m.Subject)
			}
		}
		return n == 1
	})
}

// TestDelayctlPubMaxDelay: `delayctl pub --in 200h` against a delayd with
// the default DELAYD_MAX_DELAY (168h) fails with exit code 2 and a clear
// error before publishing (nothing reaches ingress); against a delayd with
// 300h it is published and placed, not dead-lettered.
func TestDelayctlPubMaxDelay(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 1h")
	url := b.Srv.ClientURL()
	ingress, err := b.NC.SubscribeSync("delay.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = b.NC.Flush()
	itest.Delayctl(t, url, "pub", "orders.later", "x", "--in", "200h").Want(t, 2, "beyond the longest delay 168h0m0s", "DELAYD_MAX_DELAY")
	_ = b.NC.Flush()
	if m, err := ingress.NextMsg(500 * time.Millisecond); err == nil {
		t.Errorf("a refused pub reached ingress: %s", m.Subject)
	}
	st, err := b.JS.Stream(context.Background(), deliver.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	if last := st.CachedInfo().State.LastSeq; last != 0 {
		t.Errorf("ingress stream's last sequence %d, want 0: the refused pub was stored", last)
	}

	b.StopDelayd()
	b.StartDelayd("1s 1h", func(c *deliver.Config) { c.MaxDelay = 300 * time.Hour })
	itest.Delayctl(t, url, "pub", "orders.later", "x", "--in", "200h").Want(t, 0)
	if _, err := ingress.NextMsg(5 * time.Second); err != nil {
		t.Errorf("the accepted pub did not reach ingress: %v", err)
	}
	itest.WaitFor(t, 20*time.Second, "placed in DELAYD_1H", func() bool { return b.LevelCount("DELAYD_1H") == 1 })
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestRetryLimits: delayd.RetryMsg checks a retry against the running
// delayd's limits like Publish: a rung beyond DELAYD_MAX_DELAY is refused
// with ErrInvalidLadder before anything is published, instead of being
// dead-lettered later; a rung within it is published.
func TestRetryLimits(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 1h")
	ingress, err := b.NC.SubscribeSync("delay.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = b.NC.Flush()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ladder := delayd.MustParseLadder("1m 200h")
	msg := func(attempt string) *nats.Msg {
		return &nats.Msg{Subject: "orders.charge", Data: []byte("x"), Header: nats.Header{
			"Nats-Msg-Id": []string{"charge-1"}, delayd.HeaderAttempt: []string{attempt},
		}}
	}
	if _, err := delayd.RetryMsg(ctx, b.JS, msg("1"), ladder, errors.New("card declined")); !errors.Is(err, delayd.ErrInvalidLadder) || !strings.Contains(err.Error(), "DELAYD_MAX_DELAY") {
		t.Errorf("rung 2 (200h) beyond the max delay: %v, want ErrInvalidLadder naming DELAYD_MAX_DELAY", err)
	}
	if m, err := ingress.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("the refused retry reached ingress: %s", m.Subject)
	}
	if _, err := delayd.RetryMsg(ctx, b.JS, msg("0"), ladder, errors.New("card declined")); err != nil {
		t.Errorf("rung 1 (1m): %v", err)
	}
	if _, err := ingress.NextMsg(5 * time.Second); err != nil {
		t.Errorf("the retry within the max delay did not reach ingress: %v", err)
	}
}
