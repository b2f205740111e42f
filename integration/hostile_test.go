package integration

import (
	"bytes"
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

// headerLen is the size of h on the wire as nats.go encodes it:
// "NATS/1.0\r\n", "key: value\r\n" per value, and the closing "\r\n".
// nats.go trims a value's surrounding blanks; the values used here have none.
func headerLen(h nats.Header) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// dlqByCase returns the dead letters carrying X-Case: name.
func dlqByCase(dlq []*jetstream.RawStreamMsg, name string) []*jetstream.RawStreamMsg {
	var out []*jetstream.RawStreamMsg
	for _, m := range dlq {
		if m.Header.Get("X-Case") == name {
			out = append(out, m)
		}
	}
	return out
}

// TestHostileStatusHeaders publishes empty messages whose user headers look
// like the server's status messages (a pull consumer's "409 Consumer
// Deleted", "404 No Messages", "408 Request Timeout", "503 No Responders",
// "100 Idle Heartbeat", direct get's "204 EOB"). delayd reads such
// messages itself twice (the router's pull of the ingress stream, the
// scanner's direct get of the level stream): neither may mistake them for a
// status. Each must be delivered like any message, and routing must go on.
func TestHostileStatusHeaders(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.CreateStream("HOSTILE", "hostile.js.>")
	b.StartDelayd("100ms 1s")
	c := b.Collect("hostile.>")

	type statusCase struct {
		name   string
		header nats.Header
	}
	cases := []statusCase{
		{"409-consumer-deleted", nats.Header{"Status": {"409"}, "Description": {"Consumer Deleted"}}},
		{"404", nats.Header{"Status": {"404"}}},
		{"408", nats.Header{"Status": {"408"}}},
		{"503", nats.Header{"Status": {"503"}}},
		{"100", nats.Header{"Status": {"100"}}},
		{"204-eob", nats.Header{"Status": {"204"}, "Description": {"EOB"}}},
	}
	// Each case goes to a core subject and to a stream-bound subject: the
	// scanner confirms the first with a flush, the second with a PubAck.
	targets := func(name string) []string { return []string{"hostile.core." + name, "hostile.js." + name} }
	for _, tc := range cases {
		for _, target := range targets(tc.name) {
			h := cloneHeader(tc.header)
			h["Delay-Level"] = []string{"1"}
			h["X-Case"] = []string{tc.name}
			b.Publish("delay."+target, nil, h)
		}
	}
	b.Publish("delay.hostile.core.canary", []byte("canary"), itest.Level(1))

	want := 2*len(cases) + 1
	got := waitCount(c, want, 15*time.Second)
	if len(got) < want {
		t.Errorf("got %d deliveries, want %d within 15s", len(got), want)
	}
	bySubject := make(map[string][]*nats.Msg)
	for _, r := range got {
		bySubject[r.Msg.Subject] = append(bySubject[r.Msg.Subject], r.Msg)
	}
	if n := len(bySubject["hostile.core.canary"]); n != 1 {
		t.Errorf("canary delivered %d times, want 1", n)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, target := range targets(tc.name) {
				ms := bySubject[target]
				if len(ms) != 1 {
					t.Errorf("%s: %d deliveries, want 1", target, len(ms))
					continue
				}
				user := cloneHeader(tc.header)
				user["X-Case"] = []string{tc.name}
				checkDelivered(t, ms[0].Header, ms[0].Data, nil, user, "", 100*time.Millisecond)
			}
		})
	}

	// The stream-bound copies are stored with their headers.
	waitCond(10*time.Second, func() bool { return b.StreamCount("HOSTILE") >= uint64(len(cases)) })
	for _, m := range b.StreamMsgs("HOSTILE") {
		name := strings.TrimPrefix(m.Subject, "hostile.js.")
		i := slices.IndexFunc(cases, func(c statusCase) bool { return c.name == name })
		if i < 0 {
			t.Errorf("unexpected message in HOSTILE on %q", m.Subject)
			continue
		}
		if len(m.Data) != 0 {
			t.Errorf("%s: stored payload %q, want empty", m.Subject, m.Data)
		}
		for k, v := range cases[i].header {
			if got := m.Header.Values(k); !slices.Equal(got, v) {
				t.Errorf("%s: stored header %s = %q, want %q", m.Subject, k, got, v)
			}
		}
	}
	if n := b.StreamCount("HOSTILE"); n != uint64(len(cases)) {
		t.Errorf("HOSTILE holds %d messages, want %d", n, len(cases))
	}

	// Everything was routed and acked: the work-queue ingress is empty, and
	// nothing was dead-lettered.
	if !waitCond(10*time.Second, func() bool { return b.StreamCount(deliver.IngressStream) == 0 }) {
		t.Errorf("DELAYD_INGRESS still holds %d messages", b.StreamCount(deliver.IngressStream))
	}
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		t.Errorf("DELAYD_DLQ holds %d messages, want 0", n)
	}
	// No late duplicate shows up.
	itest.WaitQuiet(t, 500*time.Millisecond, 10*time.Second, func() int { return len(c.Snapshot()) })
	if n := len(c.Snapshot()); n != want {
		t.Errorf("%d deliveries in all, want %d", n, want)
	}
}

// waitCount waits until c has n deliveries or timeout passes, and returns
// what it has; it does not fail the test.
func waitCount(c *itest.Collector, n int, timeout time.Duration) []itest.Received {
	deadline := time.After(timeout)
	for {
		if got := c.Snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-c.Ch:
		case <-deadline:
			return c.Snapshot()
		}
	}
}

// waitCond polls cond until it holds or timeout passes; it does not fail the test.
func waitCond(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestHostileStatusHeaderTail makes a status-looking message (empty payload,
// user header Status) the last message of its level stream, then restarts
// delayd: on start, and after any failed level write, the router reads each
// level stream's tail, and the scanner reads its stream from the committed
// offset. Neither read may take the stored message for a server status.
// Each status runs on its own server, so one wedged router does not hide
// the others.
func TestHostileStatusHeaderTail(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		header nats.Header
	}{
		{"409-consumer-deleted", nats.Header{"Status": {"409"}, "Description": {"Consumer Deleted"}}},
		{"404", nats.Header{"Status": {"404"}}},
		{"408", nats.Header{"Status": {"408"}}},
		{"503", nats.Header{"Status": {"503"}}},
		{"100", nats.Header{"Status": {"100"}}},
		{"204-eob", nats.Header{"Status": {"204"}, "Description": {"EOB"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			b.StartDelayd("100ms 1s")
			c := b.Collect("tail.>")
			h := cloneHeader(tc.header)
			h["Delay-Level"] = []string{"1"}
			b.Publish("delay.tail.hostile", nil, h)
			if got := waitCount(c, 1, 10*time.Second); len(got) != 1 {
				t.Errorf("before restart: %d deliveries, want 1", len(got))
			}
			b.StopDelayd()
			b.StartDelayd("100ms 1s")
			b.Publish("delay.tail.canary", []byte("canary"), itest.Level(1))
			got := waitCount(c, 2, 10*time.Second)
			if i := slices.IndexFunc(got, func(r itest.Received) bool { return r.Msg.Subject == "tail.canary" }); i < 0 {
				t.Errorf("after a restart with the message as the level's tail: canary not delivered within 10s (%d deliveries)", len(got))
			}
			if !waitCond(5*time.Second, func() bool { return b.StreamCount(deliver.IngressStream) == 0 }) {
				t.Errorf("DELAYD_INGRESS still holds %d messages", b.StreamCount(deliver.IngressStream))
			}
			if n := len(c.Snapshot()); n > 2 {
				t.Errorf("%d deliveries, want 2 (the hostile message delivered again?)", n)
			}
		})
	}
}

// TestHostileHeaderLimit publishes a message whose header block is the
// largest the server accepts (64 KiB): delayd's own headers push its level
// write over the limit. It must be dead-lettered with reason "size", saying
// what the dead letter had to drop, and routing must go on.
func TestHostileHeaderLimit(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)

	// Find the largest X-Big value the server accepts, on a scratch stream
	// (every stream has the same header limit), before delayd runs.
	b.CreateStream("PROBE", "probe.>")
	hdrFor := func(n int, id string) nats.Header {
		return nats.Header{"Delay-Level": {"1"}, "X-Case": {"hdr-limit"}, "X-Big": {strings.Repeat("h", n)}, "Nats-Msg-Id": {id}}
	}
	const userID = "user-hdr-limit"
	accepts := func(n int) bool {
		id := fmt.Sprintf("probe-%08d", n) // as long as userID, and no dedupe across probes
		_, err := b.TryPublish("probe.x", []byte("p"), hdrFor(n, id))
		return err == nil
	}
	lo, hi := 60000, 70000 // accepts(lo), !accepts(hi)
	if !accepts(lo) || accepts(hi) {
		t.Fatalf("header limit outside [%d, %d)", lo, hi)
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if accepts(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	h := hdrFor(lo, userID)
	t.Logf("largest accepted X-Big value: %d bytes; header block %d bytes", lo, headerLen(h))

	b.StartDelayd("100ms 1s")
	ok := b.Collect("ok.>")

	data := []byte("small payload")
	if _, err := b.TryPublish("delay.big.hdr", data, h); err != nil {
		t.Fatalf("the ingress stream refused a header block of %d bytes: %v", headerLen(h), err)
	}
	b.Publish("delay.ok.canary", []byte("canary"), itest.Level(1))

	itest.WaitFor(t, 15*time.Second, "the message in DELAYD_DLQ", func() bool { return b.StreamCount(deliver.DLQStream) >= 1 })
	ok.Wait(t, 1, 15*time.Second)

	dlq := b.StreamMsgs(deliver.DLQStream)
	if len(dlq) != 1 {
		t.Fatalf("DELAYD_DLQ holds %d messages, want 1", len(dlq))
	}
	m := dlq[0]
	reason := m.Header.Get(contract.HeaderError)
	t.Logf("dead letter: subject %s, %d payload bytes, %d header bytes, %s=%q", m.Subject, len(m.Data), headerLen(m.Header), contract.HeaderError, reason)
	if want := contract.DLQSubjectPrefix + deliver.ReasonSize; m.Subject != want {
		t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
	}
	if reason == "" || strings.ContainsAny(reason, "\r\n") {
		t.Errorf("%s = %q, want a non-empty single line", contract.HeaderError, reason)
	}
	if got := m.Header.Get(contract.HeaderSubject); got != "delay.big.hdr" {
		t.Errorf("%s = %q, want %q", contract.HeaderSubject, got, "delay.big.hdr")
	}
	if got := m.Header.Get(contract.HeaderMsgID); got != "user-hdr-limit" {
		t.Errorf("%s = %q, want %q", contract.HeaderMsgID, got, "user-hdr-limit")
	}
	switch {
	case len(m.Data) == 0:
		if !strings.Contains(reason, "payload dropped") {
			t.Errorf("payload dropped but %s does not say so: %q", contract.HeaderError, reason)
		}
	case !bytes.Equal(m.Data, data):
		t.Errorf("payload neither kept nor dropped: %q", m.Data)
	}
	if _, has := m.Header["X-Big"]; has {
		if got := m.Header.Get("X-Big"); got != h.Get("X-Big") {
			t.Errorf("X-Big kept but changed: %d bytes, want %d", len(got), len(h.Get("X-Big")))
		}
		if got := m.Header.Get("X-Case"); got != "hdr-limit" {
			t.Errorf("X-Case = %q, want %q", got, "hdr-limit")
		}
	} else if !strings.Contains(reason, "user headers dropped") {
		t.Errorf("user headers dropped but %s does not say so: %q", contract.HeaderError, reason)
	}
	for k := range m.Header {
		if len(k) >= 7 && strings.EqualFold(k[:7], "Delayd-") {
			t.Errorf("internal header %q reached the dead-letter stream", k)
		}
	}
	if got := ok.Snapshot()[0].Msg; got.Subject != "ok.canary" || string(got.Data) != "canary" {
		t.Errorf("canary = %s %q", got.Subject, got.Data)
	}
	if n := b.LevelCount("DELAYD_100MS"); n > 1 {
		t.Errorf("DELAYD_100MS holds %d messages, want at most the kept tail", n)
	}
	itest.WaitFor(t, 10*time.Second, "DELAYD_INGRESS empty", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
}

// TestHostileMaxPayload publishes a message whose payload plus headers is
// exactly the server's max payload: it fits the ingress stream, but not a
// level stream once delayd adds its headers, nor the dead-letter stream with
// Delay-Error. It must land in DELAYD_DLQ with reason "size", its headers
// kept and the payload dropped (saying so), and routing must go on.
func TestHostileMaxPayload(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s")
	ok := b.Collect("ok.>")

	h := nats.Header{"Delay-Level": {"1"}, "X-User": {"keep"}, "Nats-Msg-Id": {"user-max"}}
	max := int(b.NC.MaxPayload())
	data := bytes.Repeat([]byte{'m'}, max-headerLen(h))
	t.Logf("max payload %d: %d payload bytes + %d header bytes", max, len(data), headerLen(h))
	if _, err := b.TryPublish("delay.big.max", data, h); err != nil {
		t.Fatalf("publish of exactly max payload: %v", err)
	}
	b.Publish("delay.ok.canary", []byte("canary"), itest.Level(1))

	itest.WaitFor(t, 15*time.Second, "the message in DELAYD_DLQ", func() bool { return b.StreamCount(deliver.DLQStream) >= 1 })
	ok.Wait(t, 1, 15*time.Second)

	dlq := b.StreamMsgs(deliver.DLQStream)
	if len(dlq) != 1 {
		t.Fatalf("DELAYD_DLQ holds %d messages, want 1", len(dlq))
	}
	m := dlq[0]
	reason := m.Header.Get(contract.HeaderError)
	t.Logf("dead letter: subject %s, %d payload bytes, %s=%q", m.Subject, len(m.Data), contract.HeaderError, reason)
	if want := contract.DLQSubjectPrefix + deliver.ReasonSize; m.Subject != want {
		t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
	}
	switch {
	case len(m.Data) == 0:
		if !strings.Contains(reason, "payload dropped") {
			t.Errorf("payload dropped but %s does not say so: %q", contract.HeaderError, reason)
		}
	case !bytes.Equal(m.Data, data):
		t.Errorf("payload neither kept nor dropped: %d bytes", len(m.Data))
	}
	if got := m.Header.Values("Delay-Level"); !slices.Equal(got, []string{"1"}) {
		t.Errorf("the publisher's Delay-Level = %q, want [1]; headers %v", got, m.Header)
	}
	if got := m.Header.Values("X-User"); !slices.Equal(got, []string{"keep"}) {
		t.Errorf("X-User = %q, want [keep]", got)
	}
	if got := m.Header.Get(contract.HeaderMsgID); got != "user-max" {
		t.Errorf("%s = %q, want %q", contract.HeaderMsgID, got, "user-max")
	}
	if got := m.Header.Get(contract.HeaderSubject); got != "delay.big.max" {
		t.Errorf("%s = %q, want %q", contract.HeaderSubject, got, "delay.big.max")
	}
	if id := m.Header.Get(contract.HeaderNatsMsgID); !strings.HasPrefix(id, "delayd-") {
		t.Errorf("dead letter's %s = %q, want the derived delayd-… id", contract.HeaderNatsMsgID, id)
	}
	for k := range m.Header {
		if len(k) >= 7 && strings.EqualFold(k[:7], "Delayd-") {
			t.Errorf("internal header %q reached the dead-letter stream", k)
		}
	}
	if got := ok.Snapshot()[0].Msg; got.Subject != "ok.canary" || string(got.Data) != "canary" {
		t.Errorf("canary = %s %q", got.Subject, got.Data)
	}
	itest.WaitFor(t, 10*time.Second, "DELAYD_INGRESS empty", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
}

// TestHostileOddLevels checks Delay-Level values a lenient parser might take:
// the rules of docs/guide.md#publishing are base-10 integers, surrounding white space allowed,
// a leading "+" accepted, negative values refused.
func TestHostileOddLevels(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s")
	c := b.Collect("odd.>")

	type oddCase struct {
		name  string
		value string
		// delay is the expected delay when delivered; dead means dead-lettered (reason level).
		delay time.Duration
		dead  bool
	}
	cases := []oddCase{
		{name: "nul", value: "1\x00", dead: true},
		{name: "arabic-indic", value: "١", dead: true}, // U+0661, a digit to unicode.IsDigit, not to base 10
		{name: "hex", value: " 0x1", dead: true},
		{name: "plus", value: "+1", delay: 100 * time.Millisecond},
		// "-0" is not negative: it parses as 0, so it is delivered at once
		// (RocketMQ's Integer.parseInt("-0") is 0 too: not a delay message).
		{name: "minus-zero", value: "-0", delay: 0},
		{name: "tabs", value: "\t2\t", delay: time.Second},
	}
	var sent []oddCase
	for _, tc := range cases {
		h := nats.Header{"Delay-Level": {tc.value}, "X-Case": {tc.name}}
		if _, err := b.TryPublish("delay.odd."+tc.name, []byte(tc.name), h); err != nil {
			// Not a silent skip: a refused case would shrink the sample.
			t.Errorf("case %s: the client or server refused value %q: %v", tc.name, tc.value, err)
			continue
		}
		sent = append(sent, tc)
	}
	b.Publish("delay.odd.canary", []byte("canary"), itest.Level(1))

	var nDead, nLive int
	for _, tc := range sent {
		if tc.dead {
			nDead++
		} else {
			nLive++
		}
	}
	c.Wait(t, nLive+1, 15*time.Second)
	itest.WaitFor(t, 15*time.Second, fmt.Sprintf("%d dead letters", nDead), func() bool {
		return b.StreamCount(deliver.DLQStream) >= uint64(nDead)
	})
	itest.WaitQuiet(t, 1500*time.Millisecond, 15*time.Second, func() int { return len(c.Snapshot()) + int(b.StreamCount(deliver.DLQStream)) }) // nothing else shows up, on either side
	got := c.Snapshot()
	dlq := b.StreamMsgs(deliver.DLQStream)
	if len(dlq) != nDead {
		t.Errorf("DELAYD_DLQ holds %d messages, want %d", len(dlq), nDead)
	}
	if len(got) != nLive+1 {
		t.Errorf("%d deliveries, want %d", len(got), nLive+1)
	}
	for _, tc := range sent {
		t.Run(tc.name, func(t *testing.T) {
			var delivered []*nats.Msg
			for _, r := range got {
				if r.Msg.Subject == "odd."+tc.name {
					delivered = append(delivered, r.Msg)
				}
			}
			dead := dlqByCase(dlq, tc.name)
			if tc.dead {
				if len(delivered) != 0 {
					t.Errorf("value %q delivered %d times, want dead-lettered", tc.value, len(delivered))
				}
				if len(dead) != 1 {
					t.Fatalf("value %q: %d dead letters, want 1", tc.value, len(dead))
				}
				m := dead[0]
				if want := contract.DLQSubjectPrefix + deliver.ReasonLevel; m.Subject != want {
					t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
				}
				// nats.go trims a value's surrounding blanks on the wire.
				if got, want := m.Header.Get("Delay-Level"), strings.Trim(tc.value, " \t"); got != want {
					t.Errorf("kept Delay-Level = %q, want %q", got, want)
				}
				t.Logf("value %q dead-lettered: %s", tc.value, m.Header.Get(contract.HeaderError))
				return
			}
			if len(dead) != 0 {
				t.Errorf("value %q dead-lettered (%s), want delivered", tc.value, dead[0].Header.Get(contract.HeaderError))
			}
			if len(delivered) != 1 {
				t.Fatalf("value %q delivered %d times, want 1", tc.value, len(delivered))
			}
			checkDelivered(t, delivered[0].Header, delivered[0].Data, []byte(tc.name), nats.Header{"X-Case": {tc.name}}, "", tc.delay)
		})
	}
	if i := slices.IndexFunc(got, func(r itest.Received) bool { return r.Msg.Subject == "odd.canary" }); i < 0 {
		t.Error("canary not delivered")
	}
	itest.WaitFor(t, 10*time.Second, "DELAYD_INGRESS empty", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
}
