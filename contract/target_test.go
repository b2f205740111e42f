package contract

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
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

func TestMatchSubject(t *testing.T) {
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
		if got := MatchSubject(tt.pattern, tt.subject); got != tt.want {
			t.Errorf("MatchSubject(%q, %q) = %v, want %v", tt.pattern, tt.subject, got, tt.want)
		}
	}
}

// FuzzTarget checks that whatever Target accepts is a literal NATS subject
// that is safe to publish to: run with go test -fuzz FuzzTarget ./contract/.
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

// TestValidateTargetNoPrefix: a client that does not know the service's
// ingress prefix passes "": a target under delayd's internal subjects is
// refused as such (not as "under the ingress prefix"), any other literal
// subject is accepted.
func TestValidateTargetNoPrefix(t *testing.T) {
	err := ValidateTarget("delayd.x", "")
	if !errors.Is(err, ErrForbiddenTarget) || !strings.Contains(err.Error(), "internal subjects") {
		t.Fatalf(`ValidateTarget("delayd.x", ""): %v; want forbidden, under delayd's internal subjects`, err)
	}
	if err := ValidateTarget("delay.x", ""); err != nil {
		t.Fatalf(`ValidateTarget("delay.x", ""): %v; want nil`, err)
	}
}
