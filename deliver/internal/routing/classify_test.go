package routing

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// testClassifier is a router's classifier for prefix "delay", levels
// "1s 10s 1m" (precision levels 1 ms to 512 ms below them), the longest
// delay 2h, and a policy denying "secret.>".
func testClassifier() *classifier {
	return &classifier{
		prefix:   "delay",
		levels:   levels.MustParse("1s 10s 1m"),
		targets:  contract.TargetPolicy{Deny: []string{"secret.>"}},
		maxDelay: 2 * time.Hour,
	}
}

// TestClassify covers every header case the router handles: the delay
// headers in any case and with one or several values, clamping, durations
// and times in the past, future and beyond the longest delay, ambiguity,
// merge keys, targets, the policy, and hop headers. Errors are compared as
// text (the dead letter's Delay-Error) and by message.ReasonOf (the dead-letter
// subject's last token and the metric label), which must not change.
func TestClassify(t *testing.T) {
	t.Parallel()
	c := testClassifier()
	stored := time.Date(2026, 11, 30, 8, 0, 0, 123456789, time.UTC)
	at := func(d time.Duration) string { return stored.Add(d).Format(time.RFC3339Nano) }
	level := func(i int) levels.Level {
		if i == 0 {
			return levels.Level{}
		}
		all := append(c.levels.Levels(), c.levels.PrecisionLevels()...)
		return all[i-1]
	}
	pickErr := func(v string) string {
		_, _, err := c.levels.Pick(v)
		return err.Error()
	}
	invalid := levels.ErrInvalidLevel.Error()
	tests := []struct {
		name    string
		subject string // default "delay.orders.close"
		h       nats.Header
		hop     hopCheck
		want    placement // Target defaults to "orders.close" when err is ""
		err     string    // the exact dead-letter reason text
		reason  string    // message.ReasonOf(err)
	}{
		{name: "level", h: nats.Header{"Delay-Level": {"2"}}, want: placement{Level: level(2)}},
		{name: "level lower case", h: nats.Header{"delay-level": {"1"}}, want: placement{Level: level(1)}},
		{name: "level upper case", h: nats.Header{"DELAY-LEVEL": {"3"}}, want: placement{Level: level(3)}},
		{name: "level padded", h: nats.Header{"Delay-Level": {" 3 "}}, want: placement{Level: level(3)}},
		{name: "level 0 is immediate", h: nats.Header{"Delay-Level": {"0"}}, want: placement{Level: level(0)}},
		{name: "level above the table is clamped", h: nats.Header{"Delay-Level": {"99"}}, want: placement{Level: level(3), Clamped: true}},
		{name: "level at the table's end", h: nats.Header{"Delay-Level": {"3"}}, want: placement{Level: level(3)}},
		{name: "level negative", h: nats.Header{"Delay-Level": {"-1"}}, err: pickErr("-1"), reason: message.ReasonLevel},
		{name: "level not a number", h: nats.Header{"Delay-Level": {"soon"}}, err: pickErr("soon"), reason: message.ReasonLevel},
		{name: "level empty", h: nats.Header{"Delay-Level": {""}}, err: pickErr(""), reason: message.ReasonLevel},
		{name: "level overflows", h: nats.Header{"Delay-Level": {"99999999999999999999"}}, err: pickErr("99999999999999999999"), reason: message.ReasonLevel},
		{name: "level two values", h: nats.Header{"Delay-Level": {"1", "2"}}, err: invalid + ": Delay-Level has 2 values, want one", reason: message.ReasonLevel},
		{name: "level in two cases", h: nats.Header{"Delay-Level": {"1"}, "delay-level": {"1"}}, err: invalid + ": Delay-Level has 2 values, want one", reason: message.ReasonLevel},
		{name: "level no value", h: nats.Header{"Delay-Level": {}}, err: pickErr(""), reason: message.ReasonLevel},
		{name: "no delay header", h: nats.Header{"Trace-Id": {"x"}}, err: levels.ErrMissingLevel.Error() + ": no Delay-Level, Delay-Duration or Delay-Deliver-At header", reason: message.ReasonLevel},
		{name: "no headers", h: nil, err: levels.ErrMissingLevel.Error() + ": no Delay-Level, Delay-Duration or Delay-Deliver-At header", reason: message.ReasonLevel},
		{name: "level and duration", h: nats.Header{"Delay-Level": {"1"}, "Delay-Duration": {"5s"}}, err: invalid + ": ambiguous: set exactly one of Delay-Level, Delay-Duration and Delay-Deliver-At", reason: message.ReasonLevel},
		{name: "duration and deliver-at", h: nats.Header{"delay-duration": {"5s"}, "Delay-Deliver-At": {at(time.Minute)}}, err: invalid + ": ambiguous: set exactly one of Delay-Level, Delay-Duration and Delay-Deliver-At", reason: message.ReasonLevel},

		{name: "duration", h: nats.Header{"Delay-Duration": {"90s"}}, want: placement{Level: level(3), Due: stored.Add(90 * time.Second)}},
		{name: "duration lower case padded", h: nats.Header{"delay-duration": {" 15s "}}, want: placement{Level: level(2), Due: stored.Add(15 * time.Second)}},
		{name: "duration below the table: precision level", h: nats.Header{"Delay-Duration": {"300ms"}}, want: placement{Level: level(4 + 8), Due: stored.Add(300 * time.Millisecond)}},
		{name: "duration below 1ms: level 0", h: nats.Header{"Delay-Duration": {"500us"}}, want: placement{Level: level(0), Due: stored.Add(500 * time.Microsecond)}},
		{name: "duration zero", h: nats.Header{"Delay-Duration": {"0s"}}, want: placement{Level: level(0), Due: stored}},
		{name: "duration the longest", h: nats.Header{"Delay-Duration": {"2h"}}, want: placement{Level: level(3), Due: stored.Add(2 * time.Hour)}},
		{name: "duration beyond the longest", h: nats.Header{"Delay-Duration": {"2h0m1s"}}, err: invalid + `: Delay-Duration "2h0m1s" is beyond the longest delay 2h (DELAYD_MAX_DELAY)`, reason: message.ReasonLevel},
		{name: "duration negative", h: nats.Header{"Delay-Duration": {"-5s"}}, err: invalid + `: Delay-Duration "-5s" is negative`, reason: message.ReasonLevel},
		{name: "duration not a duration", h: nats.Header{"Delay-Duration": {"5 days"}}, err: invalid + `: Delay-Duration "5 days" is not a Go duration such as 90s or 36h`, reason: message.ReasonLevel},
		{name: "duration two values", h: nats.Header{"Delay-Duration": {"1s", "2s"}}, err: invalid + ": Delay-Duration has 2 values, want one", reason: message.ReasonLevel},

		{name: "deliver-at future", h: nats.Header{"Delay-Deliver-At": {at(30 * time.Second)}}, want: placement{Level: level(2), Due: stored.Add(30 * time.Second)}},
		{name: "deliver-at lower case", h: nats.Header{"delay-deliver-at": {at(time.Hour)}}, want: placement{Level: level(3), Due: stored.Add(time.Hour)}},
		{name: "deliver-at in the past: level 0, due as requested", h: nats.Header{"Delay-Deliver-At": {at(-time.Hour)}}, want: placement{Level: level(0), Due: stored.Add(-time.Hour)}},
		{name: "deliver-at beyond the longest", h: nats.Header{"Delay-Deliver-At": {at(3 * time.Hour)}}, err: invalid + `: Delay-Deliver-At "` + at(3*time.Hour) + `" is beyond the longest delay 2h (DELAYD_MAX_DELAY)`, reason: message.ReasonLevel},
		{name: "deliver-at not RFC 3339", h: nats.Header{"Delay-Deliver-At": {"tomorrow"}}, err: invalid + `: Delay-Deliver-At "tomorrow" is not an RFC 3339 time`, reason: message.ReasonLevel},
		{name: "deliver-at two values", h: nats.Header{"Delay-Deliver-At": {at(time.Second), at(time.Second)}}, err: invalid + ": Delay-Deliver-At has 2 values, want one", reason: message.ReasonLevel},

		{name: "merge key", h: nats.Header{"Delay-Level": {"1"}, "Delay-Merge-Key": {"user-42"}}, want: placement{Level: level(1), Merge: "user-42"}},
		{name: "merge key lower case padded", h: nats.Header{"Delay-Level": {"1"}, "delay-merge-key": {" user-42 "}}, want: placement{Level: level(1), Merge: "user-42"}},
		{name: "merge key empty", h: nats.Header{"Delay-Level": {"1"}, "Delay-Merge-Key": {"  "}}, want: placement{Level: level(1)}, err: invalid + ": Delay-Merge-Key needs exactly one non-empty value", reason: message.ReasonLevel},
		{name: "merge key two values", h: nats.Header{"Delay-Level": {"1"}, "Delay-Merge-Key": {"a", "b"}}, want: placement{Level: level(1)}, err: invalid + ": Delay-Merge-Key needs exactly one non-empty value", reason: message.ReasonLevel},
		{name: "merge key error after a clamp", h: nats.Header{"Delay-Level": {"7"}, "Delay-Merge-Key": {""}}, want: placement{Level: level(3), Clamped: true}, err: invalid + ": Delay-Merge-Key needs exactly one non-empty value", reason: message.ReasonLevel},
		{name: "level error wins over merge key error", h: nats.Header{"Delay-Level": {"x"}, "Delay-Merge-Key": {""}}, err: pickErr("x"), reason: message.ReasonLevel},

		{name: "target not under the prefix", subject: "orders.close", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrInvalidTarget.Error() + `: "orders.close" is not under the ingress prefix "delay"`, reason: message.ReasonTarget},
		{name: "target missing", subject: "delay", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrInvalidTarget.Error() + `: "delay" is not under the ingress prefix "delay"`, reason: message.ReasonTarget},
		{name: "target prefix lookalike", subject: "delayed.x", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrInvalidTarget.Error() + `: "delayed.x" is not under the ingress prefix "delay"`, reason: message.ReasonTarget},
		{name: "target $ subject", subject: "delay.$JS.API.INFO", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrForbiddenTarget.Error() + `: "$JS.API.INFO": subjects starting with '$' are NATS APIs`, reason: message.ReasonTarget},
		{name: "target under the prefix", subject: "delay.delay.x", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrForbiddenTarget.Error() + `: "delay.x": under the ingress prefix "delay" (it would loop)`, reason: message.ReasonTarget},
		{name: "target under delayd's subjects", subject: "delay.delayd.level.1S.x", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrForbiddenTarget.Error() + `: "delayd.level.1S.x": under delayd's internal subjects "delayd.>"`, reason: message.ReasonTarget},
		{name: "target denied by policy", subject: "delay.secret.keys", h: nats.Header{"Delay-Level": {"1"}}, err: contract.ErrDeniedTarget.Error() + `: "secret.keys" matches deny pattern "secret.>"`, reason: message.ReasonTarget},
		{name: "target error wins over level error", subject: "delay.secret.keys", h: nil, err: contract.ErrDeniedTarget.Error() + `: "secret.keys" matches deny pattern "secret.>"`, reason: message.ReasonTarget},

		{name: "Nats headers do not classify", h: nats.Header{"Delay-Level": {"1"}, "Nats-Msg-Id": {"a"}, "Nats-Expected-Stream": {"X"}}, want: placement{Level: level(1)}},
		{name: "multi-valued user header", h: nats.Header{"Delay-Level": {"1"}, "Tag": {"a", "b"}}, want: placement{Level: level(1)}},

		{name: "hop keeps its Delayd-Merge", hop: hopValid, h: nats.Header{"Delay-Duration": {"45s"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrMerge: {"user-42"}},
			want: placement{Level: level(2), Due: stored.Add(45 * time.Second), Merge: "user-42", Hop: true}},
		{name: "hop without a merge key ignores Delay-Merge-Key", hop: hopValid, h: nats.Header{"Delay-Duration": {"45s"}, message.HdrOrigin: {"delayd-1-7"}, "Delay-Merge-Key": {"other"}},
			want: placement{Level: level(2), Due: stored.Add(45 * time.Second), Hop: true}},
		{name: "forged hop: Delay-Merge-Key, not Delayd-Merge", hop: hopForged, h: nats.Header{"Delay-Level": {"1"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrMerge: {"forged"}, "Delay-Merge-Key": {"mine"}},
			want: placement{Level: level(1), Merge: "mine"}},
		{name: "forged hop without a merge key", hop: hopForged, h: nats.Header{"Delay-Level": {"1"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrMerge: {"forged"}},
			want: placement{Level: level(1)}},
		{name: "hop: merge key errors still count", hop: hopValid, h: nats.Header{"Delay-Level": {"1"}, message.HdrOrigin: {"delayd-1-7"}, "Delay-Merge-Key": {""}},
			want: placement{Level: level(1)}, err: invalid + ": Delay-Merge-Key needs exactly one non-empty value", reason: message.ReasonLevel},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			subject := tt.subject
			if subject == "" {
				subject = "delay.orders.close"
			}
			before := cloneHeader(tt.h)
			got, err := c.classify(subject, tt.h, stored, tt.hop)
			want := tt.want
			if tt.err == "" && want.Target == "" {
				want.Target = "orders.close"
			}
			if tt.err != "" && (want.Level != levels.Level{} || want.Clamped) {
				want.Target = "orders.close" // the target was decided before the error
			}
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("error %q, want placement %+v", err, want)
			case tt.err != "" && err == nil:
				t.Fatalf("placement %+v, want error %q", got, tt.err)
			case err != nil:
				if err.Error() != tt.err {
					t.Errorf("error text\n got %q\nwant %q", err, tt.err)
				}
				if r := message.ReasonOf(err); r != tt.reason {
					t.Errorf("reasonOf = %q, want %q", r, tt.reason)
				}
			}
			if tt.err != "" {
				// On an error only what was decided before it counts.
				got.Target, want.Target = "", ""
			}
			if got != want {
				t.Errorf("placement\n got %+v\nwant %+v", got, want)
			}
			if !equalHeader(tt.h, before) {
				t.Errorf("classify changed the headers: %v, was %v", tt.h, before)
			}
		})
	}
}

// TestCheckHop: only a Delayd-Origin with the MAC of this key is a hop.
func TestCheckHop(t *testing.T) {
	t.Parallel()
	key := hop.Key("0123456789abcdef0123456789abcdef")
	subject := "delay.orders.close"
	signed := nats.Header{message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"2"}, "Delay-Duration": {"1h"}}
	key.Sign(subject, signed)
	tampered := cloneHeader(signed)
	tampered[message.HdrHops] = []string{"3"}
	for _, tt := range []struct {
		name    string
		key     hop.Key
		subject string
		h       nats.Header
		want    hopCheck
	}{
		{"no origin", key, subject, nats.Header{"Delay-Level": {"1"}}, hopNone},
		{"no headers", key, subject, nil, hopNone},
		{"signed", key, subject, signed, hopValid},
		{"another key", hop.Key("another key, another key, another"), subject, signed, hopForged},
		{"another subject", key, "delay.orders.other", signed, hopForged},
		{"a signed field changed", key, subject, tampered, hopForged},
		{"origin without a MAC", key, subject, nats.Header{message.HdrOrigin: {"delayd-1-7"}}, hopForged},
	} {
		if got := checkHop(tt.key, tt.subject, tt.h); got != tt.want {
			t.Errorf("%s: checkHop = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestLevelMessage: the level message has a fresh header built from the
// publisher's (control, Nats-* and Delayd-* headers removed, in any case)
// and delayd's; the ingress message's header is left exactly as it was.
func TestLevelMessage(t *testing.T) {
	t.Parallel()
	stored := time.Date(2026, 11, 30, 8, 0, 0, 123456789, time.UTC)
	ten := levels.Level{Index: 2, Delay: 10 * time.Second}
	const ref = "delayd-1795990280677514429-4242"
	const subj = "delayd.level.10S."
	ts := contract.FormatTime
	tests := []struct {
		name string
		h    nats.Header
		p    placement
		want nats.Header // without Nats-Expected-Last-Sequence, set on send
		due  time.Time
	}{
		{
			name: "level message",
			h: nats.Header{"Delay-Level": {"2"}, "Content-Type": {"application/json"}, "Tag": {"a", "b"},
				"Nats-Msg-Id": {"order-42"}, "Nats-Expected-Stream": {"X"}, "nats-rollup": {"all"}},
			p: placement{Level: ten, Target: "orders.close"},
			want: nats.Header{"Content-Type": {"application/json"}, "Tag": {"a", "b"},
				contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}, message.HdrMsgID: {"order-42"}},
			due: stored.Add(10 * time.Second),
		},
		{
			name: "publisher id in lower case",
			h:    nats.Header{"Delay-Level": {"2"}, "nats-msg-id": {"order-42"}},
			p:    placement{Level: ten, Target: "orders.close"},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}, message.HdrMsgID: {"order-42"}},
			due:  stored.Add(10 * time.Second),
		},
		{
			name: "publisher's own delayd headers are replaced or dropped",
			h: nats.Header{"Delay-Level": {"2"}, "delay-enqueued-at": {"1999-01-01T00:00:00Z"}, "Delay-Due-At": {"x"}, "Delay-Hops": {"9"}, "delay-rescheduled": {"9"},
				"Delayd-Msg-Id": {"forged"}, message.HdrMoves: {"9"}, "delayd-ingress": {"forged"}, message.HdrHopDue: {"x"}, hop.HdrMac: {"x"}},
			p:    placement{Level: ten, Target: "orders.close"},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}},
			due:  stored.Add(10 * time.Second),
		},
		{
			name: "merge key carried as Delayd-Merge",
			h:    nats.Header{"Delay-Level": {"2"}, "Delay-Merge-Key": {" user-42 "}},
			p:    placement{Level: ten, Target: "orders.close", Merge: "user-42"},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}, message.HdrMerge: {"user-42"}},
			due:  stored.Add(10 * time.Second),
		},
		{
			name: "due after the level: it hops on",
			h:    nats.Header{"Delay-Duration": {"45s"}},
			p:    placement{Level: ten, Target: "orders.close", Due: stored.Add(45 * time.Second)},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(45 * time.Second))}, message.HdrIngress: {ref}, message.HdrHopDue: {ts(stored.Add(10 * time.Second))}},
			due:  stored.Add(45 * time.Second),
		},
		{
			name: "due at the level's end: no hop",
			h:    nats.Header{"Delay-Duration": {"10s"}},
			p:    placement{Level: ten, Target: "orders.close", Due: stored.Add(10 * time.Second)},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}},
			due:  stored.Add(10 * time.Second),
		},
		{
			name: "deliver-at in the past: due now",
			h:    nats.Header{"Delay-Deliver-At": {"2026-11-30T07:00:00Z"}},
			p:    placement{Target: "orders.close", Due: stored.Add(-time.Hour)},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored)}, message.HdrIngress: {ref}},
			due:  stored,
		},
		{
			name: "level 0 waits for the due time itself",
			h:    nats.Header{"Delay-Duration": {"500us"}},
			p:    placement{Target: "orders.close", Due: stored.Add(500 * time.Microsecond)},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(500 * time.Microsecond))}, message.HdrIngress: {ref}},
			due:  stored.Add(500 * time.Microsecond),
		},
		{
			name: "hop keeps its first id, enqueue time, count and merge key",
			h: nats.Header{"Delay-Deliver-At": {"2026-11-30T09:00:00Z"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"2"}, message.HdrMsgID: {"order-42"},
				contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}, message.HdrMerge: {"user-42"}, "Nats-Msg-Id": {"delayd-hop-x"}, hop.HdrMac: {"mac"}, "Tag": {"t"}},
			p: placement{Level: ten, Target: "orders.close", Due: stored.Add(time.Hour), Hop: true, Merge: "user-42"},
			want: nats.Header{"Tag": {"t"}, contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}, contract.HeaderDueAt: {ts(stored.Add(time.Hour))}, message.HdrIngress: {ref},
				message.HdrMsgID: {"order-42"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"2"}, message.HdrMerge: {"user-42"}, message.HdrHopDue: {ts(stored.Add(10 * time.Second))}},
			due: stored.Add(time.Hour),
		},
		{
			name: "hop arriving overdue: at once, due unchanged",
			h:    nats.Header{message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"1"}, contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}},
			p:    placement{Target: "orders.close", Due: stored.Add(-time.Minute), Hop: true},
			want: nats.Header{contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}, contract.HeaderDueAt: {ts(stored.Add(-time.Minute))}, message.HdrIngress: {ref}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"1"}},
			due:  stored.Add(-time.Minute),
		},
		{
			name: "rescheduled: the hop keeps its move count",
			h: nats.Header{"Delay-Deliver-At": {"2026-11-30T08:00:30Z"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"0"}, message.HdrMoves: {"2"},
				contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}, "Tag": {"t"}},
			p: placement{Level: ten, Target: "orders.close", Due: stored.Add(30 * time.Second), Hop: true},
			want: nats.Header{"Tag": {"t"}, contract.HeaderEnqueuedAt: {"2026-11-30T06:00:00.000000000Z"}, contract.HeaderDueAt: {ts(stored.Add(30 * time.Second))}, message.HdrIngress: {ref},
				message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"0"}, message.HdrMoves: {"2"}, message.HdrHopDue: {ts(stored.Add(10 * time.Second))}},
			due: stored.Add(30 * time.Second),
		},
		{
			name: "forged hop: its delayd headers dropped, the publisher's Nats-Msg-Id kept",
			h:    nats.Header{"Delay-Level": {"2"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"5"}, message.HdrMoves: {"5"}, message.HdrMsgID: {"forged"}, message.HdrMerge: {"forged"}, "Nats-Msg-Id": {"mine"}},
			p:    placement{Level: ten, Target: "orders.close"},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}, message.HdrMsgID: {"mine"}},
			due:  stored.Add(10 * time.Second),
		},
		{
			name: "no headers",
			h:    nil,
			p:    placement{Level: ten, Target: "orders.close"},
			want: nats.Header{contract.HeaderEnqueuedAt: {ts(stored)}, contract.HeaderDueAt: {ts(stored.Add(10 * time.Second))}, message.HdrIngress: {ref}},
			due:  stored.Add(10 * time.Second),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			before := cloneHeader(tt.h)
			data := []byte("payload")
			out, due := levelMessage(tt.h, data, tt.p, subj, stored, ref)
			if out.Subject != subj+tt.p.Target {
				t.Errorf("subject %q, want %q", out.Subject, subj+tt.p.Target)
			}
			if !equalHeader(out.Header, tt.want) {
				t.Errorf("header\n got %v\nwant %v", out.Header, tt.want)
			}
			if !due.Equal(tt.due) {
				t.Errorf("due %v, want %v", due, tt.due)
			}
			if string(out.Data) != "payload" {
				t.Errorf("data %q", out.Data)
			}
			if !equalHeader(tt.h, before) {
				t.Errorf("the ingress header changed: %v, was %v", tt.h, before)
			}
			// Adding the send-time header must not reach the ingress message.
			out.Header["Nats-Expected-Last-Sequence"] = []string{"7"}
			if !equalHeader(tt.h, before) {
				t.Errorf("the ingress header shares the level message's map: %v", tt.h)
			}
		})
	}
}

// TestDeadLetterKeepsIngressHeaders: a dead letter is built from the
// untouched ingress message, and building it leaves the ingress message
// as it was.
func TestDeadLetterKeepsIngressHeaders(t *testing.T) {
	t.Parallel()
	r, err := NewStandalone(nil, Config{Prefix: "delay", Levels: levels.MustParse("1s 10s")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.run.ingressID = "17"
	m := &nats.Msg{Subject: "delay.orders.close", Header: nats.Header{"Delay-Level": {"2"}, "Tag": {"a"}, "Nats-Msg-Id": {"order-42"}}, Data: []byte("x")}
	before := cloneHeader(m.Header)
	p, err := r.classifier.classify(m.Subject, m.Header, time.Now(), hopNone)
	if err != nil {
		t.Fatal(err)
	}
	level, _ := levelMessage(m.Header, m.Data, p, r.writers.all[2].subject, time.Now(), r.ingressRef(9))
	level.Header["Nats-Expected-Last-Sequence"] = []string{"3"}
	dl := message.DeadLetterMsg(m.Subject, maps.Clone(m.Header), m.Data, fmt.Errorf("%w: test", message.ErrTooLarge), r.ingressRef(9))
	want := nats.Header{"Delay-Level": {"2"}, "Tag": {"a"}, contract.HeaderMsgID: {"order-42"}, contract.HeaderError: {"message too large: test"},
		contract.HeaderSubject: {"delay.orders.close"}, contract.HeaderNatsMsgID: {"delayd-17-9"}}
	if !equalHeader(dl.Header, want) {
		t.Errorf("dead letter header\n got %v\nwant %v", dl.Header, want)
	}
	if dl.Subject != "delayd.dlq."+message.ReasonSize {
		t.Errorf("dead letter subject %q", dl.Subject)
	}
	if !equalHeader(m.Header, before) {
		t.Errorf("the ingress header changed: %v, was %v", m.Header, before)
	}
}

func cloneHeader(h nats.Header) nats.Header {
	if h == nil {
		return nil
	}
	c := make(nats.Header, len(h))
	for k, v := range h {
		c[k] = slices.Clone(v)
	}
	return c
}

func equalHeader(a, b nats.Header) bool {
	return maps.EqualFunc(a, b, func(x, y []string) bool { return slices.Equal(x, y) })
}

// TestCascadeLevelWithoutPrecision: without precision levels, a remaining delay below the shortest level goes to
// the shortest level (its wait ends after the due time: delivered at the due time, never early), below 1 ms to
// level 0; with them, to the longest precision level not longer than it.
func TestCascadeLevelWithoutPrecision(t *testing.T) {
	t.Parallel()
	table := levels.MustParse("1s 5s")
	for _, tc := range []struct {
		remaining time.Duration
		on, off   time.Duration // the level's delay
	}{
		{0, 0, 0},
		{500 * time.Microsecond, 0, 0},
		{time.Millisecond, time.Millisecond, time.Second},
		{300 * time.Millisecond, 256 * time.Millisecond, time.Second},
		{999 * time.Millisecond, 512 * time.Millisecond, time.Second},
		{time.Second, time.Second, time.Second},
		{7 * time.Second, 5 * time.Second, 5 * time.Second},
	} {
		on := (&classifier{levels: table}).cascadeLevel(tc.remaining)
		off := (&classifier{levels: table.WithoutPrecision()}).cascadeLevel(tc.remaining)
		if on.Delay != tc.on || off.Delay != tc.off {
			t.Errorf("cascadeLevel(%s) = %s with precision levels, %s without; want %s and %s", tc.remaining, on.Delay, off.Delay, tc.on, tc.off)
		}
	}
	// The message placed in the longer level carries no hop due: its scanner delivers it at Delay-Due-At.
	stored := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := placement{Level: table.Levels()[0], Target: "x", Due: stored.Add(300 * time.Millisecond)}
	m, due := levelMessage(nats.Header{}, nil, p, "delayd.level.1S.", stored, "ref")
	if m.Header.Get(message.HdrHopDue) != "" || !due.Equal(p.Due) || m.Header.Get(contract.HeaderDueAt) != contract.FormatTime(p.Due) {
		t.Errorf("level message %v due %s, want no %s and Delay-Due-At %s", m.Header, due, message.HdrHopDue, p.Due)
	}
}
