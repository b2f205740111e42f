package cancelapi

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// TestRescheduleDue: the new due of each delay header, from the request's
// time now (docs/pending.md#21-the-decision): now plus the level's delay
// or the duration, the Delay-Deliver-At time, "run now" (now itself) for
// 0 or a time at or before now, a Delay-Level above the table clamped, and
// a due beyond DELAYD_MAX_DELAY from now refused with a 400 answer naming
// the header.
func TestRescheduleDue(t *testing.T) {
	t.Parallel()
	table := levels.MustParse("1s 5s 1h")
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	const maxDelay = 2 * time.Hour
	for _, tc := range []struct {
		header, value string
		want          time.Time // zero: refused
	}{
		{contract.HeaderLevel, "2", now.Add(5 * time.Second)},
		{contract.HeaderLevel, "0", now},
		{contract.HeaderLevel, "9", now.Add(time.Hour)}, // clamped, as a publish
		{contract.HeaderDuration, "90s", now.Add(90 * time.Second)},
		{contract.HeaderDuration, "0s", now},
		{contract.HeaderDuration, "2h", now.Add(2 * time.Hour)},
		{contract.HeaderDuration, "2h1s", time.Time{}},
		{contract.HeaderDeliverAt, now.Add(time.Minute).Format(time.RFC3339Nano), now.Add(time.Minute)},
		{contract.HeaderDeliverAt, now.Format(time.RFC3339Nano), now},
		{contract.HeaderDeliverAt, now.Add(-time.Hour).Format(time.RFC3339Nano), now}, // the past: run now
		{contract.HeaderDeliverAt, now.Add(3 * time.Hour).Format(time.RFC3339Nano), time.Time{}},
	} {
		d, err := message.ParseDelay(nats.Header{tc.header: {tc.value}}, table)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.header, tc.value, err)
		}
		due, err := rescheduleDue(d, now, maxDelay)
		switch {
		case tc.want.IsZero():
			m := rescheduleReplyMsg(0, time.Time{}, err)
			if err == nil || m.Header.Get(contract.HeaderStatus) != "400" ||
				!strings.HasPrefix(string(m.Data), "error: invalid delay") || !strings.Contains(string(m.Data), tc.header) {
				t.Errorf("%s %s: due %s, answer %d %q; want a 400 answer \"error: invalid delay …\" naming %s", tc.header, tc.value, due, status(string(m.Data), err), m.Data, tc.header)
			}
		case err != nil || !due.Equal(tc.want):
			t.Errorf("%s %s: due %s, %v; want %s", tc.header, tc.value, due, err, tc.want)
		}
	}
}

// TestRescheduleReply: the reschedule API's answers and codes: the cancel
// API's, with "rescheduled" 200 carrying the new due in Delay-Due-At, a
// cancelled message not found, and a request's own error 400.
func TestRescheduleReply(t *testing.T) {
	t.Parallel()
	due := time.Date(2026, 12, 3, 12, 0, 0, 5, time.UTC)
	for _, tc := range []struct {
		answer level.CancelAnswer
		err    error
		body   string
		code   int
	}{
		{level.AnswerRescheduled, nil, contract.RescheduleReplyRescheduled, contract.RescheduleStatusRescheduled},
		{level.AnswerGone, nil, contract.CancelReplyNotFound, contract.CancelStatusNotFound},
		{level.AnswerCancelled, nil, contract.CancelReplyNotFound, contract.CancelStatusNotFound},
		{level.AnswerDelivered, nil, contract.CancelReplyDelivered, contract.CancelStatusDelivered},
		{0, badReschedule{errors.New("Delay-Duration has 2 values, want one")}, "error: Delay-Duration has 2 values, want one", contract.CancelStatusBadRequest},
		{0, ambiguous("7"), "", contract.CancelStatusBadRequest},
		{0, level.ErrCancelBusy, "error: " + level.ErrCancelBusy.Error(), contract.CancelStatusBusy},
		{0, ErrRouterBehind, "error: " + ErrRouterBehind.Error(), contract.CancelStatusRouterBehind},
		{0, errors.New("boom"), "error: boom", contract.CancelStatusError},
	} {
		m := rescheduleReplyMsg(tc.answer, due, tc.err)
		if got := m.Header.Get(contract.HeaderStatus); got != strconv.Itoa(tc.code) || (tc.body != "" && string(m.Data) != tc.body) {
			t.Errorf("answer %v, error %v: %s %q, want %d %q", tc.answer, tc.err, got, m.Data, tc.code, tc.body)
		}
		dueAt := m.Header.Get(contract.HeaderDueAt)
		if want := tc.answer == level.AnswerRescheduled && tc.err == nil; (dueAt == contract.FormatTime(due)) != want || (dueAt != "") != want {
			t.Errorf("answer %v, error %v: Delay-Due-At %q, want it only on rescheduled (%s)", tc.answer, tc.err, dueAt, contract.FormatTime(due))
		}
	}
}
