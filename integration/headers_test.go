package integration

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/integration/internal/itest"
)

// userHeaders returns 20 user header keys: unicode values, a key with three
// values, mixed-case keys and two keys that differ only in case.
func userHeaders() nats.Header {
	h := nats.Header{
		"X-Unicode-Latin": {"héllo wörld ✓"},
		"X-Unicode-Japan": {"日本語"},
		"X-Emoji":         {"🚀 delayed"},
		"X-Repeated":      {"first", "second", "third"},
		"x-lower-case":    {"lower"},
		"X-MiXeD-CaSe":    {"mixed"},
		"X-UPPER":         {"upper"},
		"X-Dup-Case":      {"canonical"},
		"x-dup-case":      {"lower twin"},
		"Content-Type":    {"application/octet-stream"},
		"X-Empty-Looking": {"-"},
		"X-Colon":         {"a: b: c"},
		"X-Plain":         {"value"},
		"Delay-Custom":    {"a user header that merely starts with Delay-"},
	}
	for i := len(h); i < 20; i++ {
		h[fmt.Sprintf("X-User-%02d", i)] = []string{fmt.Sprintf("value %d", i)}
	}
	return h
}

func allBytes() []byte {
	data := make([]byte, 256)
	for i := range data {
		data[i] = byte(i)
	}
	return data
}

func cloneHeader(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for k, v := range h {
		out[k] = slices.Clone(v)
	}
	return out
}

// checkDelivered checks one delivered (or stored) message against what was
// published: payload, every user header with its values in order, the
// Nats-Msg-Id, no control/internal/instruction header, and the two delivery
// times with due - enqueued == delay.
func checkDelivered(t *testing.T, got nats.Header, data []byte, wantData []byte, user nats.Header, msgID string, delay time.Duration) (enq, due time.Time) {
	t.Helper()
	if !bytes.Equal(data, wantData) {
		t.Errorf("payload is not byte-identical: got %d bytes %q, want %d bytes", len(data), data, len(wantData))
	}
	for k, want := range user {
		if v := got[k]; !slices.Equal(v, want) {
			t.Errorf("user header %q = %q, want %q", k, v, want)
		}
	}
	if msgID != "" {
		if v := got.Values(contract.HeaderNatsMsgID); !slices.Equal(v, []string{msgID}) {
			t.Errorf("%s = %q, want [%q]", contract.HeaderNatsMsgID, v, msgID)
		}
	}
	for k := range got {
		switch {
		case strings.EqualFold(k, contract.HeaderLevel):
			t.Errorf("control header %q was delivered", k)
		case len(k) >= 7 && strings.EqualFold(k[:7], "Delayd-"):
			t.Errorf("internal header %q was delivered", k)
		case len(k) >= 5 && strings.EqualFold(k[:5], "Nats-") && k != contract.HeaderNatsMsgID:
			t.Errorf("JetStream header %q reached the target", k)
		}
	}
	// Exactly the user's keys plus the three delayd sets.
	want := slices.Sorted(maps.Keys(user))
	want = append(want, contract.HeaderDueAt, contract.HeaderEnqueuedAt, contract.HeaderNatsMsgID)
	slices.Sort(want)
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Errorf("header keys = %q, want %q", keys, want)
	}
	enq = parseTime(t, got, contract.HeaderEnqueuedAt)
	due = parseTime(t, got, contract.HeaderDueAt)
	if d := due.Sub(enq); d != delay {
		t.Errorf("%s - %s = %s, want exactly %s", contract.HeaderDueAt, contract.HeaderEnqueuedAt, d, delay)
	}
	return enq, due
}

func TestHeadersPreserved(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 300ms 1s")

	t.Run("level 1", func(t *testing.T) {
		c := b.Collect("hdr.one")
		user := userHeaders()
		h := cloneHeader(user)
		h["Delay-Level"] = []string{"1"}
		h[contract.HeaderNatsMsgID] = []string{"user-msg-id-1"}
		h[contract.HeaderHops] = []string{"7"} // delayd's to set: a publisher's value is dropped
		before := time.Now()
		b.Publish("delay.hdr.one", allBytes(), h)
		after := time.Now()

		r := c.Wait(t, 1, 10*time.Second)[0]
		enq, due := checkDelivered(t, r.Msg.Header, r.Msg.Data, allBytes(), user, "user-msg-id-1", 100*time.Millisecond)
		if enq.Before(before.Add(-time.Second)) || enq.After(after) {
			t.Errorf("%s = %s, want within [%s, %s]", contract.HeaderEnqueuedAt, enq, before.Add(-time.Second), after)
		}
		if r.At.Before(due) {
			t.Errorf("delivered at %s, before due %s (%s early)", r.At, due, due.Sub(r.At))
		}
	})

	t.Run("level 0", func(t *testing.T) {
		c := b.Collect("hdr.zero")
		user := userHeaders()
		h := cloneHeader(user)
		h["delay-level"] = []string{"0"}
		h[contract.HeaderNatsMsgID] = []string{"user-msg-id-0"}
		before := time.Now()
		b.Publish("delay.hdr.zero", allBytes(), h)
		after := time.Now()

		r := c.Wait(t, 1, 10*time.Second)[0]
		enq, due := checkDelivered(t, r.Msg.Header, r.Msg.Data, allBytes(), user, "user-msg-id-0", 0)
		if !enq.Equal(due) {
			t.Errorf("level 0: %s = %s, %s = %s; want equal", contract.HeaderEnqueuedAt, enq, contract.HeaderDueAt, due)
		}
		if enq.Before(before.Add(-time.Second)) || enq.After(after) {
			t.Errorf("%s = %s, want within [%s, %s]", contract.HeaderEnqueuedAt, enq, before.Add(-time.Second), after)
		}
	})

	t.Run("derived id and instruction headers", func(t *testing.T) {
		c := b.Collect("hdr.derived.>")
		user := nats.Header{"X-User": {"u"}}
		var seqs []uint64
		for i, subject := range []string{"delay.hdr.derived.a", "delay.hdr.derived.b"} {
			h := cloneHeader(user)
			h["Delay-Level"] = []string{"1"}
			// Instructions the ingress stream accepts; they acted there.
			h["Nats-Expected-Stream"] = []string{"DELAYD_INGRESS"}
			if i == 0 {
				h["Nats-Expected-Last-Subject-Sequence"] = []string{"0"}
			}
			seqs = append(seqs, b.Publish(subject, []byte(subject), h))
		}
		got := c.Wait(t, 2, 10*time.Second)
		ids := map[string]string{}
		for i, r := range got {
			checkDelivered(t, r.Msg.Header, r.Msg.Data, []byte("delay."+r.Msg.Subject), user, "", 100*time.Millisecond)
			id := r.Msg.Header.Get(contract.HeaderNatsMsgID)
			seq := seqs[0]
			if r.Msg.Subject == "hdr.derived.b" {
				seq = seqs[1]
			}
			if !strings.HasPrefix(id, "delayd-") || !strings.Contains(id, "-"+strconv.FormatUint(seq, 10)+"-") {
				t.Errorf("delivery %d: derived %s = %q, want delayd-<ingress id>-%d-<mac>", i, contract.HeaderNatsMsgID, id, seq)
			}
			ids[id] = r.Msg.Subject
		}
		if len(ids) != 2 {
			t.Errorf("two messages without Nats-Msg-Id got ids %v, want two different ids", ids)
		}
	})

	t.Run("stream-bound target", func(t *testing.T) {
		b.CreateStream("BOUND", "bound.>")
		user := userHeaders()
		h := cloneHeader(user)
		h["Delay-Level"] = []string{"1"}
		h[contract.HeaderNatsMsgID] = []string{"user-msg-id-bound"}
		before := time.Now()
		b.Publish("delay.bound.x", allBytes(), h)
		after := time.Now()

		itest.WaitFor(t, 10*time.Second, "the delivery stored in BOUND", func() bool { return b.StreamCount("BOUND") >= 1 })
		msgs := b.StreamMsgs("BOUND")
		if len(msgs) != 1 {
			t.Fatalf("BOUND holds %d messages, want 1", len(msgs))
		}
		m := msgs[0]
		if m.Subject != "bound.x" {
			t.Errorf("stored subject = %q, want %q", m.Subject, "bound.x")
		}
		enq, due := checkDelivered(t, m.Header, m.Data, allBytes(), user, "user-msg-id-bound", 100*time.Millisecond)
		if enq.Before(before.Add(-time.Second)) || enq.After(after) {
			t.Errorf("%s = %s, want within [%s, %s]", contract.HeaderEnqueuedAt, enq, before.Add(-time.Second), after)
		}
		if m.Time.Before(due) {
			t.Errorf("stored at %s, before due %s", m.Time, due)
		}
	})
}
