package deliver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/levels"
)

func TestTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		subject string
		prefix  string
		want    string // target when valid
		wantErr error  // ErrInvalidTarget, ErrForbiddenTarget or nil
	}{
		// Valid.
		{subject: "delay.orders.close", prefix: "delay", want: "orders.close"},
		{subject: "delay.a", prefix: "delay", want: "a"},
		{subject: "delay.orders.123.close", prefix: "delay", want: "orders.123.close"},
		{subject: "delay.orders.$x", prefix: "delay", want: "orders.$x"},     // '$' only forbidden first
		{subject: "delay.orders.a*", prefix: "delay", want: "orders.a*"},     // "a*" is a literal token
		{subject: "delay.orders.a>", prefix: "delay", want: "orders.a>"},     // so is "a>"
		{subject: "delay.delayed.x", prefix: "delay", want: "delayed.x"},     // not under "delay."
		{subject: "delay.delaydx.y", prefix: "delay", want: "delaydx.y"},     // not under "delayd."
		{subject: "delay.x.delayd", prefix: "delay", want: "x.delayd"},       // only the first token counts
		{subject: "delay.x.delay.y", prefix: "delay", want: "x.delay.y"},     // likewise
		{subject: "delay.héllo.日本語", prefix: "delay", want: "héllo.日本語"},     // UTF-8 tokens
		{subject: "app.delay.orders", prefix: "app.delay", want: "orders"},   // multi-token prefix
		{subject: "app.delay.app.x", prefix: "app.delay", want: "app.x"},     // "app.x" is not under "app.delay"
		{subject: "app.delay.delay.x", prefix: "app.delay", want: "delay.x"}, // prefix is "app.delay", not "delay"
		{subject: "delay.Delayd.x", prefix: "delay", want: "Delayd.x"},       // subjects are case-sensitive
		{subject: "delay.delay-x.y", prefix: "delay", want: "delay-x.y"},     // a different token
		{subject: "delay.orders.close-" + strings.Repeat("x", 200), prefix: "delay", want: "orders.close-" + strings.Repeat("x", 200)},

		// Not under the prefix, or an invalid subject.
		{subject: "delay", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "orders.close", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delayx.orders", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "dela", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "app.orders", prefix: "app.delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders..close", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay..orders", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders.", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay..", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders.*", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders.>", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.*", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.>", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.*.close", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders close", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders\tclose", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders\r\nclose", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders\x00", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay.orders\x7f", prefix: "delay", wantErr: ErrInvalidTarget},
		{subject: "delay. orders", prefix: "delay", wantErr: ErrInvalidTarget},

		// Forbidden: NATS APIs, the ingress prefix, delayd's internal subjects.
		{subject: "delay.$JS.API.STREAM.DELETE.DELAYD_1S", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.$SYS.x", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.$KV.DELAYD_OFFSETS.DELAYD_1S", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.$x", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.$", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.delay", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.delay.orders", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.delayd", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.delayd.level.1S.x", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "delay.delayd.dlq.level", prefix: "delay", wantErr: ErrForbiddenTarget},
		{subject: "app.delay.app.delay.x", prefix: "app.delay", wantErr: ErrForbiddenTarget},
		{subject: "app.delay.delayd.x", prefix: "app.delay", wantErr: ErrForbiddenTarget},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.subject), func(t *testing.T) {
			t.Parallel()
			got, err := Target(tt.subject, tt.prefix)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Target(%q, %q) = %v, want %q", tt.subject, tt.prefix, err, tt.want)
				}
				if got != tt.want {
					t.Fatalf("Target(%q, %q) = %q, want %q", tt.subject, tt.prefix, got, tt.want)
				}
				if err := ValidateTarget(got, tt.prefix); err != nil {
					t.Fatalf("ValidateTarget(%q) = %v after Target accepted it", got, err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Target(%q, %q) = %q, %v; want an error wrapping %q", tt.subject, tt.prefix, got, err, tt.wantErr)
			}
			other := ErrForbiddenTarget
			if tt.wantErr == ErrForbiddenTarget {
				other = ErrInvalidTarget
			}
			if errors.Is(err, other) {
				t.Fatalf("Target(%q) = %v: wraps both sentinels", tt.subject, err)
			}
			if got != "" {
				t.Fatalf("Target(%q) returned target %q with an error", tt.subject, got)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("Target(%q) error is not one line: %q", tt.subject, err)
			}
		})
	}
}

func TestValidateTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		target  string
		wantErr error
	}{
		{"orders.close", nil},
		{"a", nil},
		{"a.b.c.d.e.f", nil},
		{"x.$JS.API", nil},
		{"", ErrInvalidTarget},
		{".", ErrInvalidTarget},
		{".a", ErrInvalidTarget},
		{"a.", ErrInvalidTarget},
		{"a..b", ErrInvalidTarget},
		{"*", ErrInvalidTarget},
		{">", ErrInvalidTarget},
		{"a.*", ErrInvalidTarget},
		{"a.>.b", ErrInvalidTarget},
		{"a b", ErrInvalidTarget},
		{"a\nb", ErrInvalidTarget},
		{"a\x01b", ErrInvalidTarget},
		{"$JS.API.STREAM.LIST", ErrForbiddenTarget},
		{"$SYS.REQ.SERVER.PING", ErrForbiddenTarget},
		{"$KV.b.k", ErrForbiddenTarget},
		{"$O.b.k", ErrForbiddenTarget},
		{"delay", ErrForbiddenTarget},
		{"delay.x", ErrForbiddenTarget},
		{"delayd", ErrForbiddenTarget},
		{"delayd.level.5S.x", ErrForbiddenTarget},
		{"delayd.dlq.target", ErrForbiddenTarget},
		// Invalid syntax wins over forbidden placement.
		{"$JS.*", ErrInvalidTarget},
		{"delayd.>", ErrInvalidTarget},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.target), func(t *testing.T) {
			t.Parallel()
			err := ValidateTarget(tt.target, "delay")
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("ValidateTarget(%q) = %v, want nil", tt.target, err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ValidateTarget(%q) = %v, want an error wrapping %q", tt.target, err, tt.wantErr)
			}
		})
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{">", "a", true},
		{">", "a.b.c", true},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false}, // '>' needs at least one token
		{"a.>", "b.c", false},
		{"a.>", "ab.c", false},
		{"a.b.>", "a.b", false},
		{"a.b.>", "a.b.c", true},
		{"a.*", "a.b", true},
		{"a.*", "a", false},
		{"a.*", "a.b.c", false},
		{"a.*", "b.c", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.b", "a.b", true},
		{"*.b", "a.c", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.x.c", true},
		{"a.*.c", "a.b.d", false},
		{"a.*.c", "a.b", false},
		{"a.*.c", "a.b.c.d", false},
		{"a.*.>", "a.b.c", true},
		{"a.*.>", "a.b", false},
		{"a.b", "a.b", true},
		{"a.b", "a.bc", false},
		{"a.b", "a.b.c", false}, // subject longer
		{"a.b.c", "a.b", false}, // subject shorter
		{"a.b", "a", false},
		{"a", "a.b", false},
		{"orders", "orders", true},
		{"orders", "order", false},
		{"bound.>", "bound.x", true},
	}
	for _, tt := range tests {
		if got := subjectMatches(tt.pattern, tt.subject); got != tt.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", tt.pattern, tt.subject, got, tt.want)
		}
	}
}

func TestParseIngressRef(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		id  string
		seq uint64
	}{
		{"1767225600123456789", 1},
		{"1767225600123456789", 42},
		{"1", 1<<64 - 1},
		{"0", 0},
	} {
		r := &Router{ingressID: tt.id}
		ref := r.ingressRef(tt.seq)
		if want := "delayd-" + tt.id + "-" + strconv.FormatUint(tt.seq, 10); ref != want {
			t.Errorf("ingressRef(%d) = %q, want %q", tt.seq, ref, want)
		}
		id, seq, ok := parseIngressRef(ref)
		if !ok || id != tt.id || seq != tt.seq {
			t.Errorf("parseIngressRef(%q) = %q, %d, %v; want %q, %d, true", ref, id, seq, ok, tt.id, tt.seq)
		}
	}
	for _, bad := range []string{
		"",
		"delayd-",
		"delayd-123",
		"delayd-123-",
		"delayd-123-x",
		"delayd-123--1",
		"delayd-123-18446744073709551616", // overflows uint64
		"user-id-1",
		"Delayd-123-4",
		"123-4",
	} {
		if id, seq, ok := parseIngressRef(bad); ok {
			t.Errorf("parseIngressRef(%q) = %q, %d, true; want not ok", bad, id, seq)
		}
	}
}

func TestReasonOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{ErrInvalidTarget, ReasonTarget},
		{ErrForbiddenTarget, ReasonTarget},
		{fmt.Errorf("%w: %q", ErrInvalidTarget, "a..b"), ReasonTarget},
		{fmt.Errorf("%w: %q", ErrForbiddenTarget, "$JS.API"), ReasonTarget},
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
		got := reasonOf(tt.err)
		if got != tt.want {
			t.Errorf("reasonOf(%v) = %q, want %q", tt.err, got, tt.want)
		}
		if !slices.Contains(reasons, got) {
			t.Errorf("reasonOf(%v) = %q: not one of the closed set %q", tt.err, got, reasons)
		}
		if !server.IsValidPublishSubject(DLQSubjectPrefix + got) {
			t.Errorf("dead-letter subject %q is not a valid publish subject", DLQSubjectPrefix+got)
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
		got := oneLine(tt.in)
		if got != tt.want {
			t.Errorf("oneLine(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.ContainsAny(got, "\r\n") {
			t.Errorf("oneLine(%q) = %q: still holds a line break", tt.in, got)
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
			reason:      fmt.Errorf("%w: %q: subjects starting with '$' are NATS APIs", ErrForbiddenTarget, "$SYS.x"),
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
			m := deadLetterMsg(subject, tt.header, data, tt.reason, id)
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
			if got := m.Header.Get(HeaderSubject); got != subject {
				t.Errorf("%s = %q, want %q", HeaderSubject, got, subject)
			}
			reason := m.Header.Get(HeaderError)
			if reason == "" || strings.ContainsAny(reason, "\r\n") {
				t.Errorf("%s = %q, want a non-empty single line", HeaderError, reason)
			}
			if want := oneLine(tt.reason.Error()); reason != want {
				t.Errorf("%s = %q, want %q", HeaderError, reason, want)
			}
			if got := m.Header.Values(HeaderNatsMsgID); !slices.Equal(got, []string{id}) {
				t.Errorf("%s = %q, want [%q] (the derived id)", HeaderNatsMsgID, got, id)
			}
			if got, ok := m.Header[HeaderMsgID]; tt.wantUserID == "" && ok {
				t.Errorf("%s = %q, want absent", HeaderMsgID, got)
			} else if tt.wantUserID != "" && !slices.Equal(got, []string{tt.wantUserID}) {
				t.Errorf("%s = %q, want [%q]", HeaderMsgID, got, tt.wantUserID)
			}
			want := len(tt.wantKept) + 3 // Delay-Error, Delay-Subject, Nats-Msg-Id
			if tt.wantUserID != "" {
				want++
			}
			for k := range m.Header {
				if hasPrefixFold(k, "Nats-") && k != HeaderNatsMsgID {
					t.Errorf("JetStream instruction header %q kept: it would act on the dead-letter stream", k)
				}
			}
			if len(m.Header) != want {
				t.Errorf("headers = %v, want %d keys", m.Header, want)
			}
		})
	}
}

func TestStripInternal(t *testing.T) {
	t.Parallel()
	h := nats.Header{
		// Removed: JetStream's direct-get and instruction headers, delayd's reserved headers.
		"Nats-Stream":                 {"DELAYD_1S"},
		"Nats-Sequence":               {"3"},
		"Nats-Time-Stamp":             {"2026-01-01T00:00:00Z"},
		"Nats-Subject":                {"delayd.level.1S.orders"},
		"Nats-Expected-Last-Sequence": {"2"},
		"Nats-Msg-Id":                 {"x"},
		"nats-msg-id":                 {"y"},
		"NATS-TTL":                    {"1s"},
		"Delayd-Msg-Id":               {"user-1"},
		"Delayd-Ingress":              {"delayd-1-2"},
		"delayd-anything":             {"z"},
		// Kept.
		"Delay-Enqueued-At": {"2026-01-01T00:00:00.000000000Z"},
		"Delay-Due-At":      {"2026-01-01T00:00:01.000000000Z"},
		"X-Nats-Foo":        {"kept"},
		"Natsy":             {"kept"},
		"Nats":              {"kept"},
		"Delay-Other":       {"kept"},
		"X-User":            {"1", "2"},
	}
	kept := nats.Header{
		"Delay-Enqueued-At": {"2026-01-01T00:00:00.000000000Z"},
		"Delay-Due-At":      {"2026-01-01T00:00:01.000000000Z"},
		"X-Nats-Foo":        {"kept"},
		"Natsy":             {"kept"},
		"Nats":              {"kept"},
		"Delay-Other":       {"kept"},
		"X-User":            {"1", "2"},
	}
	stripInternal(h)
	if len(h) != len(kept) {
		t.Errorf("after stripInternal: %v, want %v", h, kept)
	}
	for k, want := range kept {
		if got := h[k]; !slices.Equal(got, want) {
			t.Errorf("header %q = %q, want %q", k, got, want)
		}
	}
	stripInternal(nil) // must not panic
}

// FuzzTarget checks that whatever Target accepts is a literal NATS subject
// that is safe to publish to: run with go test -fuzz FuzzTarget ./deliver/.
func FuzzTarget(f *testing.F) {
	for _, s := range []string{
		"delay.orders.close", "delay.a", "delay", "delay.", "delay..", "delay.orders..close",
		"delay.orders.*", "delay.orders.>", "delay.>", "delay.*", "delay.$JS.API.STREAM.DELETE.DELAYD_1S",
		"delay.$SYS.x", "delay.delay.orders", "delay.delayd.level.1S.x", "delay.delayd", "delay.orders close",
		"delay.orders\tclose", "delay.orders\x00", "delay.héllo", "delay.a*.b>", "orders.close", "delayx.y",
		"delay.orders.\r\n", "delay.\u00a0", "delay.a.\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		const prefix = "delay"
		target, err := Target(subject, prefix)
		if err != nil {
			if !errors.Is(err, ErrInvalidTarget) && !errors.Is(err, ErrForbiddenTarget) {
				t.Fatalf("Target(%q) = %v: wraps neither sentinel", subject, err)
			}
			if target != "" {
				t.Fatalf("Target(%q) = %q with error %v", subject, target, err)
			}
			return
		}
		if want := strings.TrimPrefix(subject, prefix+"."); target != want || !strings.HasPrefix(subject, prefix+".") {
			t.Fatalf("Target(%q) = %q, want %q", subject, target, want)
		}
		for i, tok := range strings.Split(target, ".") {
			switch tok {
			case "":
				t.Fatalf("Target(%q) = %q: empty token %d", subject, target, i)
			case "*", ">":
				t.Fatalf("Target(%q) = %q: wildcard token %d", subject, target, i)
			}
		}
		if strings.ContainsAny(target, " \t\r\n\f\v\x00") {
			t.Fatalf("Target(%q) = %q: holds white space", subject, target)
		}
		if strings.HasPrefix(target, "$") || strings.HasPrefix(target, "delay.") || strings.HasPrefix(target, "delayd.") ||
			target == "delay" || target == "delayd" {
			t.Fatalf("Target(%q) = %q: a forbidden target was accepted", subject, target)
		}
		if !server.IsValidLiteralSubject(target) || !server.IsValidPublishSubject(target) {
			t.Fatalf("Target(%q) = %q: nats-server does not take it as a literal publish subject", subject, target)
		}
		if err := ValidateTarget(target, prefix); err != nil {
			t.Fatalf("ValidateTarget(%q) = %v after Target accepted it", target, err)
		}
	})
}

func TestTargetPolicy(t *testing.T) {
	t.Parallel()
	p := TargetPolicy{Allow: []string{"orders.>", "billing.*.retry"}, Deny: []string{"orders.secret.>"}}
	for target, ok := range map[string]bool{
		"orders.close":          true,
		"orders.a.b.c":          true,
		"billing.42.retry":      true,
		"billing.42.retry.x":    false,
		"orders.secret.x":       false, // deny wins over allow
		"payments.refund":       false, // no allow pattern matches
		"_INBOX.abc":            false,
		"orders.secretive.ok.x": true,
	} {
		err := p.Check(target)
		if (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want allowed=%v", target, err, ok)
		}
		if err != nil && !errors.Is(err, ErrDeniedTarget) {
			t.Errorf("Check(%q) = %v, want ErrDeniedTarget", target, err)
		}
	}
	if err := (TargetPolicy{Deny: []string{"_INBOX.>"}}).Check("orders.x"); err != nil {
		t.Errorf("deny-only policy refused an unlisted target: %v", err)
	}
	if reasonOf(fmt.Errorf("x: %w", ErrDeniedTarget)) != ReasonTarget {
		t.Error("a denied target is not dead-lettered with reason target")
	}
	for _, bad := range []string{"", "a..b", "a.>.b", "a*", "a b", ">x"} {
		if ValidatePattern(bad) == nil {
			t.Errorf("ValidatePattern(%q) accepted", bad)
		}
	}
	for _, good := range []string{">", "*", "a.*", "a.>", "a.*.c"} {
		if err := ValidatePattern(good); err != nil {
			t.Errorf("ValidatePattern(%q) = %v", good, err)
		}
	}
}
