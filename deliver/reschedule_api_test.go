package deliver

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestRescheduleRequest: the reschedule API's request parsing and answers
// (docs/pending.md#21-the-decision), against a running Service. Delay
// headers missing, given twice, more than one kind, unparsable or past
// DELAYD_MAX_DELAY are answered 400 naming the header, before the id is
// looked at; a valid delay header is matched case-insensitively; an
// unknown id, or an existing one asked on another target's scope, is not
// found. An existing id in scope, scoped or through the operator's
// unscoped subject, is rescheduled (200, the new due in Delay-Due-At: the
// request's time plus the delay), and the message stays pending (its
// status says so). The answers are counted.
func TestRescheduleRequest(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	r := b.startConfig("A", Config{Levels: levels.MustParse("1s 1h"), LeaseTTL: ownerTTL, MaxDelay: 2 * time.Hour})
	b.publishTo("tgt.rs.a", "stays", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"rs-1"}})
	b.waitRouted()
	ask := func(subject, id string, h nats.Header) (code int, body string) {
		t.Helper()
		m, err := b.nc.RequestMsg(&nats.Msg{Subject: subject, Data: []byte(id), Header: h}, time.Minute)
		if err != nil {
			t.Fatalf("reschedule %s on %s: %v", id, subject, err)
		}
		code, _ = strconv.Atoi(m.Header.Get(contract.HeaderStatus))
		return code, string(m.Data)
	}
	scoped := contract.RescheduleSubjectFor("tgt.rs.a")
	in := func(d string) nats.Header { return nats.Header{contract.HeaderDuration: {d}} }
	for _, tc := range []struct {
		name   string
		h      nats.Header
		naming string // the 400 answer names it
	}{
		{"no delay header", nats.Header{"X-Other": {"1"}}, contract.HeaderDuration},
		{"two kinds", nats.Header{contract.HeaderLevel: {"1"}, contract.HeaderDuration: {"5s"}}, "exactly one"},
		{"two values", nats.Header{contract.HeaderDuration: {"5s", "6s"}}, contract.HeaderDuration},
		{"two spellings", nats.Header{contract.HeaderDeliverAt: {"2030-01-01T00:00:00Z"}, "delay-deliver-at": {"2030-01-01T00:00:00Z"}}, contract.HeaderDeliverAt},
		{"bad duration", in("soon"), contract.HeaderDuration},
		{"negative duration", in("-5s"), contract.HeaderDuration},
		{"bad level", nats.Header{contract.HeaderLevel: {"x"}}, contract.HeaderLevel},
		{"bad deliver-at", nats.Header{contract.HeaderDeliverAt: {"tomorrow"}}, contract.HeaderDeliverAt},
		{"past DELAYD_MAX_DELAY", in("2h1m"), "DELAYD_MAX_DELAY"},
	} {
		code, body := ask(scoped, "rs-1", tc.h)
		if code != contract.CancelStatusBadRequest || !strings.HasPrefix(body, contract.CancelReplyErrorPrefix) || !strings.Contains(body, tc.naming) {
			t.Errorf("%s: %d %q, want a 400 error answer naming %s", tc.name, code, body, tc.naming)
		}
	}
	if code, body := ask(scoped, "rs-1", in("3h")); !strings.HasPrefix(body, "error: invalid delay") || code != contract.CancelStatusBadRequest {
		t.Errorf("past DELAYD_MAX_DELAY: %d %q, want 400 \"error: invalid delay …\"", code, body)
	}
	for _, tc := range []struct {
		name, subject, id string
		h                 nats.Header
	}{
		{"unknown id", scoped, "rs-none", in("5s")},
		{"unknown id, header in lower case", scoped, "rs-none", nats.Header{"delay-level": {"1"}}},
		{"another target's id", contract.RescheduleSubjectFor("tgt.rs.b"), "rs-1", in("5s")},
		{"another target's id, a prefix of its target", contract.RescheduleSubjectFor("tgt.rs"), "rs-1", in("5s")},
	} {
		if code, body := ask(tc.subject, tc.id, tc.h); code != contract.CancelStatusNotFound || body != contract.CancelReplyNotFound {
			t.Errorf("%s: %d %q, want 404 %q", tc.name, code, body, contract.CancelReplyNotFound)
		}
	}
	// An existing id in scope is moved (the second request moves the
	// first's new message), 30 min on: it stays pending.
	for _, subject := range []string{scoped, contract.RescheduleSubject} {
		before := time.Now()
		m, err := b.nc.RequestMsg(&nats.Msg{Subject: subject, Data: []byte("rs-1"), Header: in("30m")}, time.Minute)
		if err != nil {
			t.Fatalf("reschedule rs-1 on %s: %v", subject, err)
		}
		code, _ := strconv.Atoi(m.Header.Get(contract.HeaderStatus))
		due, derr := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
		if code != contract.RescheduleStatusRescheduled || string(m.Data) != contract.RescheduleReplyRescheduled || derr != nil {
			t.Errorf("existing id on %s: %d %q, Delay-Due-At %q: want 200 %q with the new due", subject, code, m.Data, m.Header.Get(contract.HeaderDueAt), contract.RescheduleReplyRescheduled)
		} else if lo, hi := before.Add(29*time.Minute), time.Now().Add(31*time.Minute); due.Before(lo) || due.After(hi) {
			t.Errorf("existing id on %s: new due %s, want 30 min after the request (%s..%s)", subject, due, lo, hi)
		}
	}
	m, err := b.nc.Request(contract.StatusSubjectFor("tgt.rs.a"), []byte("rs-1"), time.Minute)
	if err != nil || string(m.Data) != contract.StatusReplyPending {
		t.Errorf("status of rs-1 after the requests: %v %v, want pending", m, err)
	}
	want := RescheduleStats{Rescheduled: 2, NotFound: 4, BadRequest: 10}
	if got := r.svc.RescheduleStats(); got != want {
		t.Errorf("RescheduleStats %+v, want %+v", got, want)
	}
}
