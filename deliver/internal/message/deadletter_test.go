package message

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestDLQRefusals: a dead letter waits from its first refusal until it is
// stored, however often it is refused meanwhile; the router's waiting ones
// are forgotten when a new ingress session redelivers them.
func TestDLQRefusals(t *testing.T) {
	t.Parallel()
	var d Refusals
	full := errors.New("maximum messages exceeded")
	start := time.Now()
	d.Refused("DELAYD_1S", full)
	for time.Since(start) < 20*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	d.Refused("DELAYD_1S", full) // a retry, refused again
	d.Refused(RouterRefusal+"delayd-1-7", full)
	got := d.Snapshot()
	if got.Failures != 3 || got.Waiting != 2 || !errors.Is(got.LastErr, full) {
		t.Fatalf("snapshot = %+v, want 3 failures, 2 waiting, the last error", got)
	}
	if got.Oldest < 10*time.Millisecond {
		t.Errorf("oldest waiting for %s, want at least the 20 ms since the first refusal: the retry restarted the clock", got.Oldest)
	}
	if n := d.RouterWaiting(); n != 1 {
		t.Errorf("routerWaiting = %d, want 1", n)
	}
	d.Forget(RouterRefusal)
	if got := d.Snapshot(); got.Waiting != 1 {
		t.Errorf("after forget(router): %d waiting, want the scanner's 1", got.Waiting)
	}
	d.Stored("DELAYD_1S")
	if got := d.Snapshot(); got.Waiting != 0 || got.Oldest != 0 || got.Failures != 3 {
		t.Errorf("after stored: %+v, want nothing waiting and the failures still counted", got)
	}
	var none *Refusals
	none.Refused("x", full)
	none.Stored("x")
	if got := none.Snapshot(); got.Waiting != 0 {
		t.Errorf("nil tracker: %+v", got)
	}
}

func TestReasonOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{contract.ErrInvalidTarget, ReasonTarget},
		{contract.ErrForbiddenTarget, ReasonTarget},
		{fmt.Errorf("%w: %q", contract.ErrInvalidTarget, "a..b"), ReasonTarget},
		{fmt.Errorf("%w: %q", contract.ErrForbiddenTarget, "$JS.API"), ReasonTarget},
		{fmt.Errorf("x: %w", contract.ErrDeniedTarget), ReasonTarget},
		{fmt.Errorf("%w: Delay-Duration \"x\" is negative", ErrInvalidDelay), ReasonLevel},
		{fmt.Errorf("%w: Delay-Merge-Key needs exactly one non-empty value", ErrInvalidMergeKey), ReasonLevel},
		{levels.ErrMissingLevel, ReasonLevel},
		{levels.ErrInvalidLevel, ReasonLevel},
		{levels.ErrLevelOverflow, ReasonLevel},
		{fmt.Errorf("levels: %q: negative: %w", "-1", levels.ErrInvalidLevel), ReasonLevel},
		{fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", levels.ErrLevelOverflow)), ReasonLevel},
		{ErrTooLarge, ReasonSize},
		{fmt.Errorf("%w: 2 MiB", ErrTooLarge), ReasonSize},
		{errors.New("target refused it 3 times"), ReasonUndeliverable},
		{io.EOF, ReasonUndeliverable},
		{levels.ErrEmptyTable, ReasonUndeliverable},
	}
	reasons := []string{ReasonLevel, ReasonTarget, ReasonSize, ReasonUndeliverable}
	for _, tt := range tests {
		got := ReasonOf(tt.err)
		if got != tt.want {
			t.Errorf("ReasonOf(%v) = %q, want %q", tt.err, got, tt.want)
		}
		if !slices.Contains(reasons, got) {
			t.Errorf("ReasonOf(%v) = %q: not one of the closed set %q", tt.err, got, reasons)
		}
		if !server.IsValidPublishSubject(contract.DLQSubjectPrefix + got) {
			t.Errorf("dead-letter subject %q is not a valid publish subject", contract.DLQSubjectPrefix+got)
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain reason", "plain reason"},
		{"a\nb", "a b"},
		{"a\r\nb", "a  b"},
		{"a\rb", "a b"},
		{"\n", " "},
		{"trailing\n", "trailing "},
		{"héllo\n日本語", "héllo 日本語"},
		{"tab\tstays", "tab\tstays"},
	}
	for _, tt := range tests {
		got := OneLine(tt.in)
		if got != tt.want {
			t.Errorf("OneLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.ContainsAny(got, "\r\n") {
			t.Errorf("OneLine(%q) = %q: still holds a line break", tt.in, got)
		}
	}
}

func TestDeadLetterMsg(t *testing.T) {
	t.Parallel()
	data := make([]byte, 256)
	for i := range data {
		data[i] = byte(i)
	}
	tests := []struct {
		name        string
		header      nats.Header
		reason      error
		wantSubject string
		wantUserID  string // Delay-Msg-Id; "" means absent
		wantKept    nats.Header
	}{
		{
			name: "bad level with publisher id and instructions",
			header: nats.Header{
				"Delay-Level":          {"abc"},
				"X-User":               {"a", "b", "c"},
				"x-lower":              {"héllo wörld ✓"},
				"Nats-Msg-Id":          {"user-id-1"},
				"Nats-Expected-Stream": {"DELAYD_INGRESS"},
				"nats-ttl":             {"5s"},
				"NATS-ROLLUP":          {"all"},
			},
			reason:      fmt.Errorf("levels: %q: not a base-10 integer\nsecond line: %w", "abc", levels.ErrInvalidLevel),
			wantSubject: "delayd.dlq.level",
			wantUserID:  "user-id-1",
			wantKept: nats.Header{
				"Delay-Level": {"abc"},
				"X-User":      {"a", "b", "c"},
				"x-lower":     {"héllo wörld ✓"},
			},
		},
		{
			name:        "forbidden target without publisher id",
			header:      nats.Header{"Delay-Level": {"0"}, "X-Case": {"forbidden"}},
			reason:      fmt.Errorf("%w: %q: subjects starting with '$' are NATS APIs", contract.ErrForbiddenTarget, "$SYS.x"),
			wantSubject: "delayd.dlq.target",
			wantKept:    nats.Header{"Delay-Level": {"0"}, "X-Case": {"forbidden"}},
		},
		{
			name:        "no headers at all",
			header:      nil,
			reason:      fmt.Errorf("%w: no Delay-Level header", levels.ErrMissingLevel),
			wantSubject: "delayd.dlq.level",
			wantKept:    nats.Header{},
		},
		{
			name:        "too large",
			header:      nats.Header{"Delay-Level": {"1"}},
			reason:      fmt.Errorf("%w: too big", ErrTooLarge),
			wantSubject: "delayd.dlq.size",
			wantKept:    nats.Header{"Delay-Level": {"1"}},
		},
		{
			name:        "undeliverable",
			header:      nats.Header{"X-A": {"1"}},
			reason:      errors.New("target refused it 3 times"),
			wantSubject: "delayd.dlq.undeliverable",
			wantKept:    nats.Header{"X-A": {"1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const subject = "delay.orders.close"
			const id = "delayd-1767225600123456789-7"
			m := DeadLetterMsg(subject, tt.header, data, tt.reason, id)
			if m.Subject != tt.wantSubject {
				t.Errorf("subject = %q, want %q", m.Subject, tt.wantSubject)
			}
			if !bytes.Equal(m.Data, data) {
				t.Errorf("payload changed")
			}
			for k, want := range tt.wantKept {
				if got := m.Header[k]; !slices.Equal(got, want) {
					t.Errorf("header %q = %q, want %q", k, got, want)
				}
			}
			if got := m.Header.Get(contract.HeaderSubject); got != subject {
				t.Errorf("%s = %q, want %q", contract.HeaderSubject, got, subject)
			}
			reason := m.Header.Get(contract.HeaderError)
			if reason == "" || strings.ContainsAny(reason, "\r\n") {
				t.Errorf("%s = %q, want a non-empty single line", contract.HeaderError, reason)
			}
			if want := OneLine(tt.reason.Error()); reason != want {
				t.Errorf("%s = %q, want %q", contract.HeaderError, reason, want)
			}
			if got := m.Header.Values(contract.HeaderNatsMsgID); !slices.Equal(got, []string{id}) {
				t.Errorf("%s = %q, want [%q] (the derived id)", contract.HeaderNatsMsgID, got, id)
			}
			if got, ok := m.Header[contract.HeaderMsgID]; tt.wantUserID == "" && ok {
				t.Errorf("%s = %q, want absent", contract.HeaderMsgID, got)
			} else if tt.wantUserID != "" && !slices.Equal(got, []string{tt.wantUserID}) {
				t.Errorf("%s = %q, want [%q]", contract.HeaderMsgID, got, tt.wantUserID)
			}
			want := len(tt.wantKept) + 3 // Delay-Error, Delay-Subject, Nats-Msg-Id
			if tt.wantUserID != "" {
				want++
			}
			for k := range m.Header {
				if HasPrefixFold(k, "Nats-") && k != contract.HeaderNatsMsgID {
					t.Errorf("JetStream instruction header %q kept: it would act on the dead-letter stream", k)
				}
			}
			if len(m.Header) != want {
				t.Errorf("headers = %v, want %d keys", m.Header, want)
			}
		})
	}
}
