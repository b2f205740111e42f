package integration

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// dlCase is one invalid message of the contract's "Invalid input" list.
type dlCase struct {
	name    string
	subject string      // published to
	header  nats.Header // besides X-Case, which every case carries
	reason  string      // "level" or "target": the dead-letter subject's last token
	target  string      // the would-be target subject, checked never to be delivered; "" to skip
	msgID   string      // a publisher Nats-Msg-Id, kept as Delay-Msg-Id

	// mayRefuse marks subjects that nats-server itself may refuse
	// (no PubAck): then the publisher gets the error, not delayd.
	mayRefuse bool
}

func TestDeadLetter(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 300ms 1s")

	// Every core message in the account, from before the first publish.
	all := b.Collect(">")

	lvl := func(values ...string) nats.Header { return nats.Header{"Delay-Level": values} }
	cases := []dlCase{
		{name: "missing", subject: "delay.orders.missing", header: nats.Header{}, reason: deliver.ReasonLevel, target: "orders.missing"},
		{name: "empty", subject: "delay.orders.empty", header: lvl(""), reason: deliver.ReasonLevel, target: "orders.empty"},
		{name: "blank", subject: "delay.orders.blank", header: lvl("   "), reason: deliver.ReasonLevel, target: "orders.blank"},
		{name: "negative", subject: "delay.orders.negative", header: lvl("-1"), reason: deliver.ReasonLevel, target: "orders.negative", msgID: "user-negative"},
		{name: "not-integer", subject: "delay.orders.abc", header: lvl("abc"), reason: deliver.ReasonLevel, target: "orders.abc"},
		{name: "fraction", subject: "delay.orders.fraction", header: lvl("1.5"), reason: deliver.ReasonLevel, target: "orders.fraction"},
		{name: "overflow", subject: "delay.orders.overflow", header: lvl("99999999999999999999"), reason: deliver.ReasonLevel, target: "orders.overflow"},
		{name: "two-values", subject: "delay.orders.two", header: func() nats.Header {
			h := nats.Header{}
			h.Add("Delay-Level", "1")
			h.Add("Delay-Level", "1")
			return h
		}(), reason: deliver.ReasonLevel, target: "orders.two"},
		{name: "two-keys", subject: "delay.orders.twokeys", header: nats.Header{"Delay-Level": {"1"}, "delay-level": {"1"}}, reason: deliver.ReasonLevel, target: "orders.twokeys"},
		{name: "instructions", subject: "delay.orders.instr", header: nats.Header{
			"Delay-Level":          {"x"},
			"Nats-Expected-Stream": {"DELAYD_INGRESS"}, // acted on ingress; must not act on DELAYD_DLQ
		}, reason: deliver.ReasonLevel, target: "orders.instr", msgID: "user-instr"},
		{name: "wildcard", subject: "delay.orders.*", header: lvl("0"), reason: deliver.ReasonTarget, target: "orders.*", mayRefuse: true},
		{name: "full-wildcard", subject: "delay.orders.>", header: lvl("0"), reason: deliver.ReasonTarget, target: "orders.>", mayRefuse: true},
		{name: "empty-token", subject: "delay.orders..close", header: lvl("0"), reason: deliver.ReasonTarget, target: "orders..close", mayRefuse: true},
		{name: "js-api", subject: "delay.$JS.API.STREAM.DELETE.DELAYD_1S", header: lvl("0"), reason: deliver.ReasonTarget, msgID: "user-js-api"},
		{name: "sys", subject: "delay.$SYS.x", header: lvl("0"), reason: deliver.ReasonTarget, target: "$SYS.x"},
		{name: "ingress-loop", subject: "delay.delay.orders", header: lvl("0"), reason: deliver.ReasonTarget, target: "delay.orders"},
		{name: "internal", subject: "delay.delayd.level.1S.x", header: lvl("0"), reason: deliver.ReasonTarget, target: "delayd.level.1S.x"},
		{name: "internal-dlq", subject: "delay.delayd.dlq.level", header: lvl("1"), reason: deliver.ReasonTarget},
	}

	type sent struct {
		dlCase
		seq  uint64
		data []byte
	}
	var want []sent
	for _, c := range cases {
		h := nats.Header{}
		for k, v := range c.header {
			h[k] = slices.Clone(v)
		}
		h["X-Case"] = []string{c.name}
		if c.msgID != "" {
			h[contract.HeaderNatsMsgID] = []string{c.msgID}
		}
		data := append([]byte("payload of "+c.name+"\x00\xff"), c.name...)
		seq, err := b.TryPublish(c.subject, data, h)
		if err != nil && !c.mayRefuse {
			t.Fatalf("case %s: publish %q: %v", c.name, c.subject, err)
		}
		if err != nil {
			// The server refused the subject itself: the publisher is told
			// at once, nothing reaches delayd, nothing is lost.
			t.Logf("case %s: publishing to %q failed: %v (refused by the server; not a dead letter)", c.name, c.subject, err)
			continue
		}
		want = append(want, sent{dlCase: c, seq: seq, data: data})
	}
	itest.WaitFor(t, 15*time.Second, fmt.Sprintf("%d dead letters", len(want)), func() bool {
		return b.StreamCount(deliver.DLQStream) >= uint64(len(want))
	})

	// A valid message after all the bad ones still routes, on every level.
	ok := b.Collect("ok.>")
	b.Publish("delay.ok.after", []byte("after"), itest.Level(1))
	b.Publish("delay.ok.after1s", []byte("after1s"), itest.Level(3))
	ok.Wait(t, 2, 15*time.Second)

	dlq := b.StreamMsgs(deliver.DLQStream)
	if len(dlq) != len(want) {
		t.Errorf("DELAYD_DLQ holds %d messages, want %d", len(dlq), len(want))
	}
	byCase := make(map[string]int)
	for _, m := range dlq {
		byCase[m.Header.Get("X-Case")]++
	}
	for _, w := range want {
		t.Run(w.name, func(t *testing.T) {
			if n := byCase[w.name]; n != 1 {
				t.Fatalf("%d dead letters, want 1", n)
			}
			i := slices.IndexFunc(dlq, func(m *jetstream.RawStreamMsg) bool { return m.Header.Get("X-Case") == w.name })
			m := dlq[i]
			if wantSubj := contract.DLQSubjectPrefix + w.reason; m.Subject != wantSubj {
				t.Errorf("dead-letter subject = %q, want %q", m.Subject, wantSubj)
			}
			if !bytes.Equal(m.Data, w.data) {
				t.Errorf("payload = %q, want %q", m.Data, w.data)
			}
			if got := m.Header.Values("X-Case"); !slices.Equal(got, []string{w.name}) {
				t.Errorf("user header X-Case = %q, want [%q]", got, w.name)
			}
			for k, v := range w.header {
				if strings.HasPrefix(k, "Nats-") {
					continue
				}
				// The NATS header wire format drops a value's leading blanks.
				v = slices.Clone(v)
				for i := range v {
					v[i] = strings.TrimLeft(v[i], " \t")
				}
				if got := m.Header.Values(k); !slices.Equal(got, v) {
					t.Errorf("user header %s = %q, want %q", k, got, v)
				}
			}
			reason := m.Header.Get(contract.HeaderError)
			if reason == "" || strings.ContainsAny(reason, "\r\n") {
				t.Errorf("%s = %q, want a non-empty single line", contract.HeaderError, reason)
			}
			if n := len(m.Header.Values(contract.HeaderError)); n != 1 {
				t.Errorf("%s has %d values, want 1", contract.HeaderError, n)
			}
			if got := m.Header.Get(contract.HeaderSubject); got != w.subject {
				t.Errorf("%s = %q, want %q", contract.HeaderSubject, got, w.subject)
			}
			if got, has := m.Header[contract.HeaderMsgID]; w.msgID == "" && has {
				t.Errorf("%s = %q, want absent (no publisher id)", contract.HeaderMsgID, got)
			} else if w.msgID != "" && !slices.Equal(got, []string{w.msgID}) {
				t.Errorf("%s = %q, want [%q] (the publisher's Nats-Msg-Id)", contract.HeaderMsgID, got, w.msgID)
			}
			id := m.Header.Get(contract.HeaderNatsMsgID)
			if !strings.HasPrefix(id, "delayd-") || !strings.HasSuffix(id, fmt.Sprintf("-%d", w.seq)) {
				t.Errorf("%s = %q, want the derived id delayd-<ingress id>-%d", contract.HeaderNatsMsgID, id, w.seq)
			}
			for k := range m.Header {
				if len(k) >= 5 && strings.EqualFold(k[:5], "Nats-") && k != contract.HeaderNatsMsgID {
					t.Errorf("JetStream instruction header %s reached the dead-letter stream", k)
				}
			}
		})
	}

	// None of them was delivered: no message on any would-be target.
	for _, m := range all.Snapshot() {
		for _, c := range cases {
			if c.target != "" && m.Msg.Subject == c.target {
				t.Errorf("case %s: a message reached the would-be target %q: %q", c.name, c.target, m.Msg.Data)
			}
		}
		if strings.HasPrefix(m.Msg.Subject, "orders.") {
			t.Errorf("a message reached %q: %q", m.Msg.Subject, m.Msg.Data)
		}
	}

	// The confused-deputy attempt deleted nothing.
	if _, err := b.JS.Stream(context.Background(), "DELAYD_1S"); err != nil {
		t.Fatalf("stream DELAYD_1S after the $JS.API dead letter: %v", err)
	}
	// A dead letter is counted once its write's PubAck is back, which may
	// trail its arrival in DELAYD_DLQ: wait for the count, then check it.
	itest.WaitFor(t, 10*time.Second, "the router's dead-letter count", func() bool {
		rs, _ := b.Svc.Stats()
		return rs.DeadLettered >= uint64(len(want))
	})
	rs, _ := b.Svc.Stats()
	if rs.DeadLettered != uint64(len(want)) {
		t.Errorf("router counted %d dead letters, want %d", rs.DeadLettered, len(want))
	}
}

// TestDeadLetterValidSpellings checks what the contract accepts that a strict
// parser might refuse: a lower-case header key and a value with spaces.
func TestDeadLetterValidSpellings(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 300ms 1s")
	c := b.Collect("spell.>")

	b.Publish("delay.spell.lower", []byte("lower"), nats.Header{"delay-level": {"1"}, "X-A": {"a"}})
	b.Publish("delay.spell.upper", []byte("upper"), nats.Header{"DELAY-LEVEL": {"1"}})
	b.Publish("delay.spell.spaced", []byte("spaced"), nats.Header{"Delay-Level": {" 2 "}})
	b.Publish("delay.spell.clamped", []byte("clamped"), nats.Header{"Delay-Level": {"99"}})

	got := c.Wait(t, 4, 15*time.Second)
	wantDelay := map[string]time.Duration{
		"spell.lower": 100 * time.Millisecond, "spell.upper": 100 * time.Millisecond,
		"spell.spaced": 300 * time.Millisecond, "spell.clamped": time.Second,
	}
	for _, r := range got {
		enq := parseTime(t, r.Msg.Header, contract.HeaderEnqueuedAt)
		due := parseTime(t, r.Msg.Header, contract.HeaderDueAt)
		if d := due.Sub(enq); d != wantDelay[r.Msg.Subject] {
			t.Errorf("%s: due - enqueued = %s, want %s", r.Msg.Subject, d, wantDelay[r.Msg.Subject])
		}
		for k := range r.Msg.Header {
			if strings.EqualFold(k, contract.HeaderLevel) {
				t.Errorf("%s: control header %q delivered", r.Msg.Subject, k)
			}
		}
	}
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		t.Errorf("DELAYD_DLQ holds %d messages, want 0", n)
	}
	if rs, _ := b.Svc.Stats(); rs.Clamped != 1 {
		t.Errorf("router counted %d clamped levels, want 1", rs.Clamped)
	}
}

// TestDeadLetterTooLarge publishes a message that fits the ingress stream but
// not the server's max payload once delayd adds its headers: it must be
// dead-lettered with reason "size" (payload dropped if even the dead letter
// does not fit), and routing must go on.
func TestDeadLetterTooLarge(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 300ms 1s")

	h := nats.Header{"Delay-Level": {"1"}}
	// "NATS/1.0\r\n" + "Delay-Level: 1\r\n" + "\r\n": the ingress message is exactly max payload.
	hdrLen := len("NATS/1.0\r\n") + len("Delay-Level: 1\r\n") + len("\r\n")
	data := bytes.Repeat([]byte{'x'}, int(b.NC.MaxPayload())-hdrLen)
	h.Set("Nats-Msg-Id", "user-too-large")
	data = data[:len(data)-len("Nats-Msg-Id: user-too-large\r\n")]
	b.Publish("delay.big.x", data, h)

	ok := b.Collect("ok.>")
	b.Publish("delay.ok.after", []byte("after"), itest.Level(1))

	itest.WaitFor(t, 10*time.Second, "the too-large message in DELAYD_DLQ", func() bool {
		return b.StreamCount(deliver.DLQStream) >= 1
	})
	// Routing goes on after it.
	ok.Wait(t, 1, 10*time.Second)

	m := b.StreamMsgs(deliver.DLQStream)[0]
	if len(m.Data) != 0 && !bytes.Equal(m.Data, data) {
		t.Errorf("payload neither kept nor dropped: %d bytes", len(m.Data))
	}
	if got := m.Header.Get("Delay-Level"); got != "1" {
		t.Errorf("the publisher's Delay-Level header = %q, want it kept as %q; headers %v", got, "1", m.Header)
	}
	if got := m.Header.Get(contract.HeaderMsgID); got != "user-too-large" {
		t.Errorf("%s = %q, want %q", contract.HeaderMsgID, got, "user-too-large")
	}
	for k := range m.Header {
		if len(k) >= 7 && strings.EqualFold(k[:7], "Delayd-") {
			t.Errorf("internal header %q reached the dead-letter stream", k)
		}
	}
	if want := contract.DLQSubjectPrefix + deliver.ReasonSize; m.Subject != want {
		t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
	}
	if got := m.Header.Get(contract.HeaderSubject); got != "delay.big.x" {
		t.Errorf("%s = %q, want %q", contract.HeaderSubject, got, "delay.big.x")
	}
	if m.Header.Get(contract.HeaderError) == "" {
		t.Errorf("%s missing", contract.HeaderError)
	}
}

// TestDeadLetterUndeliverable delivers to a stream-bound target that refuses
// the message permanently (larger than the stream's max message size). After
// the scanner's attempts it lands in DELAYD_DLQ as "undeliverable", with its
// payload, user headers and the publisher's Nats-Msg-Id kept as Delay-Msg-Id,
// and the level goes on delivering.
func TestDeadLetterUndeliverable(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	if _, err := b.JS.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 512, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	b.StartDelayd("100ms 300ms 1s")

	data := bytes.Repeat([]byte{0xab}, 1024)
	b.Publish("delay.small.big", data, nats.Header{"Delay-Level": {"1"}, "X-User": {"u1", "u2"}, "Nats-Msg-Id": {"user-big"}})

	// Later messages at the same level keep the scanner awake: a refused
	// delivery that is the level's last message is tested on its own, in
	// TestDeadLetterUndeliverableLastInLevel.
	deadline := time.Now().Add(15 * time.Second)
	for b.StreamCount(deliver.DLQStream) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("timed out after 15s waiting for the refused message in DELAYD_DLQ")
		}
		b.Publish("delay.small.ok", []byte("fits"), nats.Header{"Delay-Level": {"1"}})
		time.Sleep(150 * time.Millisecond) // pacing the nudges, not a correctness wait
	}
	itest.WaitFor(t, 15*time.Second, "the next message delivered to SMALL", func() bool {
		return b.StreamCount("SMALL") >= 1
	})
	m := b.StreamMsgs(deliver.DLQStream)[0]
	if want := contract.DLQSubjectPrefix + deliver.ReasonUndeliverable; m.Subject != want {
		t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
	}
	if !bytes.Equal(m.Data, data) {
		t.Errorf("payload changed: %d bytes", len(m.Data))
	}
	if got := m.Header.Values("X-User"); !slices.Equal(got, []string{"u1", "u2"}) {
		t.Errorf("X-User = %q, want [u1 u2]", got)
	}
	if got := m.Header.Get(contract.HeaderSubject); got != "small.big" && got != "delay.small.big" {
		t.Errorf("%s = %q, want the target or the ingress subject", contract.HeaderSubject, got)
	}
	if reason := m.Header.Get(contract.HeaderError); reason == "" || strings.ContainsAny(reason, "\r\n") {
		t.Errorf("%s = %q, want a non-empty single line", contract.HeaderError, reason)
	}
	if got := m.Header.Get(contract.HeaderMsgID); got != "user-big" {
		t.Errorf("%s = %q, want %q (the publisher's Nats-Msg-Id); headers %v", contract.HeaderMsgID, got, "user-big", m.Header)
	}
	for k := range m.Header {
		if len(k) >= 7 && strings.EqualFold(k[:7], "Delayd-") {
			t.Errorf("internal header %q reached the dead-letter stream", k)
		}
	}
}

// TestDeadLetterUndeliverableLastInLevel is TestDeadLetterUndeliverable with
// the refused message alone in its level: nothing else will ever wake the
// scanner, so it must retry (and then dead-letter) on its own.
func TestDeadLetterUndeliverableLastInLevel(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	if _, err := b.JS.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 512, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	b.StartDelayd("100ms 300ms 1s")

	b.Publish("delay.small.big", bytes.Repeat([]byte{0xab}, 1024), nats.Header{"Delay-Level": {"1"}})
	itest.WaitFor(t, 15*time.Second, "the refused message, alone in its level, in DELAYD_DLQ", func() bool {
		return b.StreamCount(deliver.DLQStream) >= 1
	})
	// The scanner counts a dead letter once its write's PubAck is back,
	// which may trail its arrival in DELAYD_DLQ: wait for the count, then
	// check that it is exactly one.
	itest.WaitFor(t, 10*time.Second, "DELAYD_100MS's dead-letter count", func() bool {
		return b.ScannerStats("DELAYD_100MS").DeadLettered >= 1
	})
	if n := b.ScannerStats("DELAYD_100MS").DeadLettered; n != 1 {
		t.Errorf("scanner DELAYD_100MS dead-lettered %d, want 1", n)
	}
}

// TestDeadLetterRunAfterPlacement: one placement, then more invalid
// messages than the router's in-flight window, back to back. The router
// must not wait for an index group it never writes.
func TestDeadLetterRunAfterPlacement(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s")
	b.StopDelayd()
	b.Publish("delay.dlrun.x", []byte("valid"), itest.Level(1))
	for range 50 {
		b.Publish("delay.dlrun.x", []byte("invalid"), nil)
	}
	b.StartDelayd("1s", func(c *deliver.Config) { c.Router.MaxInFlight = 4 })
	itest.WaitFor(t, 20*time.Second, "ingress drained", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
	if n := b.StreamCount(deliver.DLQStream); n != 50 {
		t.Errorf("DELAYD_DLQ holds %d, want 50", n)
	}
}
