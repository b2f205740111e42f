package routing

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// TestDelayErrorSentinels checks that each kind of bad delay input wraps its
// own sentinel (levels.ErrInvalidLevel only for a bad Delay-Level), while the
// dead letter's reason and Delay-Error text stay what users and scripts
// read: reason "level", Delay-Error starting "invalid delay level".
func TestDelayErrorSentinels(t *testing.T) {
	t.Parallel()
	c := &classifier{prefix: "delay", levels: levels.Default(), maxDelay: time.Hour}
	stored := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header nats.Header
		want   error
		text   string // the dead letter's Delay-Error, as it has always read
	}{
		{"level not an integer", nats.Header{contract.HeaderLevel: {"abc"}}, levels.ErrInvalidLevel, `levels: "abc": not a base-10 integer (want 0 to 18; higher values are clamped): invalid delay level`},
		{"level negative", nats.Header{contract.HeaderLevel: {"-1"}}, levels.ErrInvalidLevel, `levels: "-1": negative (want 0 to 18; higher values are clamped): invalid delay level`},
		{"level twice", nats.Header{contract.HeaderLevel: {"1", "2"}}, levels.ErrInvalidLevel, `invalid delay level: Delay-Level has 2 values, want one`},
		{"no delay header", nats.Header{"X": {"y"}}, levels.ErrMissingLevel, `missing delay level: no Delay-Level, Delay-Duration or Delay-Deliver-At header`},
		{"duration not a duration", nats.Header{contract.HeaderDuration: {"soon"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Duration "soon" is not a Go duration such as 90s or 36h`},
		{"duration negative", nats.Header{contract.HeaderDuration: {"-1s"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Duration "-1s" is negative`},
		{"duration beyond max delay", nats.Header{contract.HeaderDuration: {"2h"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Duration "2h" is beyond the longest delay 1h (DELAYD_MAX_DELAY)`},
		{"duration twice", nats.Header{contract.HeaderDuration: {"1s", "2s"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Duration has 2 values, want one`},
		{"deliver-at not a time", nats.Header{contract.HeaderDeliverAt: {"tomorrow"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Deliver-At "tomorrow" is not an RFC 3339 time`},
		{"deliver-at beyond max delay", nats.Header{contract.HeaderDeliverAt: {"2026-12-02T00:00:00Z"}}, message.ErrInvalidDelay, `invalid delay level: Delay-Deliver-At "2026-12-02T00:00:00Z" is beyond the longest delay 1h (DELAYD_MAX_DELAY)`},
		{"two delay headers", nats.Header{contract.HeaderLevel: {"1"}, contract.HeaderDuration: {"1s"}}, message.ErrInvalidDelay, `invalid delay level: ambiguous: set exactly one of Delay-Level, Delay-Duration and Delay-Deliver-At`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.classify("delay.orders.close", tt.header, stored, hopNone)
			checkDelayError(t, err, tt.want, tt.text)
		})
	}
	t.Run("merge key", func(t *testing.T) {
		for _, v := range [][]string{{""}, {"  "}, {"a", "b"}} {
			_, err := mergeKeyOf(nats.Header{contract.HeaderMergeKey: v})
			checkDelayError(t, err, message.ErrInvalidMergeKey, "invalid delay level: Delay-Merge-Key needs exactly one non-empty value")
		}
	})
}

// delayErrNames names the sentinels, whose texts are partly the same.
var delayErrNames = map[error]string{
	levels.ErrInvalidLevel:     "levels.ErrInvalidLevel",
	levels.ErrMissingLevel:     "levels.ErrMissingLevel",
	message.ErrInvalidDelay:    "ErrInvalidDelay",
	message.ErrInvalidMergeKey: "ErrInvalidMergeKey",
}

func checkDelayError(t *testing.T, err, want error, text string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v does not wrap %s", err, delayErrNames[want])
	}
	for other, name := range delayErrNames {
		if other != want && errors.Is(err, other) {
			t.Errorf("error %v also wraps %s; want %s only", err, name, delayErrNames[want])
		}
	}
	if got := message.ReasonOf(err); got != message.ReasonLevel {
		t.Errorf("reasonOf(%v) = %q, want %q", err, got, message.ReasonLevel)
	}
	dl := message.DeadLetterMsg("delay.orders.close", nats.Header{}, nil, err, "id")
	if got := dl.Header.Get(contract.HeaderError); got != text {
		t.Errorf("Delay-Error %q, want %q", got, text)
	}
	if dl.Subject != contract.DLQSubjectPrefix+message.ReasonLevel {
		t.Errorf("dead-letter subject %q, want %q", dl.Subject, contract.DLQSubjectPrefix+message.ReasonLevel)
	}
}
