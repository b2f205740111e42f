package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/contract"
)

// TestRunUsage: usage errors exit 2 before any connection is tried.
func TestRunUsage(t *testing.T) {
	t.Setenv("DELAYD_NATS_URL", "nats://127.0.0.1:1") // never dialled
	for _, args := range [][]string{
		{"nope"}, {"stats", "--json=maybe"}, {"pub", "x"}, {"cancel"}, {"dlq"}, {"dlq", "replay", "--all", "--level", "-1"},
		{"watch", "--interval", "0s"}, {"--timeout", "0s", "levels"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d; stderr %q", args, code, exitUsage, errOut.String())
		}
	}
}

func TestCheckID(t *testing.T) {
	t.Parallel()
	for id, ok := range map[string]bool{"42": true, "order-42-close": true, "a b": true, "": false, " ": false, " 42": false, "4\n2": false} {
		if err := checkID(id); (err == nil) != ok {
			t.Errorf("checkID(%q) = %v, want ok %t", id, err, ok)
		}
	}
}

func TestBehindText(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		1500 * time.Millisecond: "1.5s", -4 * time.Second: "-", 61*time.Second + 400*time.Millisecond: "1m1s", 0: "-",
	} {
		if got := behindText(d); got != want {
			t.Errorf("behindText(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestReplayMessage checks what a replay publishes for each kind of dead letter.
func TestReplayMessage(t *testing.T) {
	t.Parallel()
	created := time.Unix(0, 1700000000000000000)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := &replayer{a: &app{cfg: config.Client{Prefix: "delay"}}, created: created, window: 2 * time.Minute, now: now}
	letterOf := func(seq uint64, h nats.Header, age time.Duration) letter {
		return newLetter(seq, contract.DLQSubjectPrefix+"target", h, []byte("x"), now.Add(-age))
	}

	// Under the prefix: published there again, dead-letter and JetStream headers dropped, delay headers kept.
	m, id, why := r.message(letterOf(7, nats.Header{
		contract.HeaderSubject: {"delay.orders.close"}, contract.HeaderError: {"denied"}, "Nats-Msg-Id": {"delayd-1-3"},
		"Nats-Expected-Stream": {"X"}, "Delay-Level": {"2"}, "X-User": {"a", "b"},
	}, time.Second))
	if m == nil {
		t.Fatalf("skipped: %s", why)
	}
	wantID := "delayd-replay-1700000000000000000-7"
	if m.Subject != "delay.orders.close" || id != wantID || m.Header.Get("Nats-Msg-Id") != wantID {
		t.Errorf("replay to %q with id %q (header %q), want delay.orders.close and %q", m.Subject, id, m.Header.Get("Nats-Msg-Id"), wantID)
	}
	for _, k := range []string{contract.HeaderSubject, contract.HeaderError, "Nats-Expected-Stream"} {
		if _, ok := m.Header[k]; ok {
			t.Errorf("replay keeps %s: %v", k, m.Header)
		}
	}
	if m.Header.Get("Delay-Level") != "2" || len(m.Header["X-User"]) != 2 {
		t.Errorf("replay headers %v, want Delay-Level 2 and both X-User values", m.Header)
	}

	// A target (undeliverable): to <prefix>.<target>, at once.
	m, _, why = r.message(letterOf(8, nats.Header{contract.HeaderSubject: {"orders.close"}, contract.HeaderDueAt: {"2026-11-30T11:00:00Z"}}, time.Second))
	if m == nil || m.Subject != "delay.orders.close" || m.Header.Get("Delay-Level") != "0" {
		t.Errorf("undeliverable replay = %+v (%s), want delay.orders.close with Delay-Level 0", m, why)
	}

	// --level replaces every delay header.
	r.level = new(int)
	*r.level = 3
	m, _, _ = r.message(letterOf(9, nats.Header{contract.HeaderSubject: {"delay.orders.close"}, "delay-duration": {"bad"}}, time.Second))
	if m.Header.Get("Delay-Level") != "3" || len(m.Header) != 2 {
		t.Errorf("--level 3 replay headers %v, want only Delay-Level 3 and Nats-Msg-Id", m.Header)
	}
	r.level = nil

	// A publisher id: restored once the letter is older than the duplicate window, deferred before.
	h := nats.Header{contract.HeaderSubject: {"delay.orders.close"}, contract.HeaderMsgID: {"order-42"}}
	if m, _, why := r.message(letterOf(10, h, time.Minute)); m != nil || !strings.Contains(why, "duplicate window") {
		t.Errorf("young letter with a publisher id: %v %q, want skipped", m, why)
	}
	m, id, _ = r.message(letterOf(10, h, 3*time.Minute))
	if m == nil || id != "order-42" || m.Header.Get(contract.HeaderMsgID) != "" {
		t.Errorf("old letter with a publisher id: id %q, headers %v; want order-42 as Nats-Msg-Id only", id, m.Header)
	}

	// Targets delayd refuses anyway stay in the DLQ.
	for _, subject := range []string{"delay.$JS.API.x", "delayd.level.5S.x", "orders.*", ""} {
		if m, _, _ := r.message(letterOf(11, nats.Header{contract.HeaderSubject: {subject}}, time.Second)); m != nil {
			t.Errorf("Delay-Subject %q replayed to %q, want skipped", subject, m.Subject)
		}
	}
}
