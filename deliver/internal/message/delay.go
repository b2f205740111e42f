package message

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// Delay is a message's requested delay: its one delay header, parsed
// ([ParseDelay]). The router places an ingress message by it, and the
// reschedule API computes a new due from it (docs/pending.md#21-the-decision).
type Delay struct {
	// Header is which delay header gave it: [contract.HeaderLevel],
	// [contract.HeaderDuration] or [contract.HeaderDeliverAt].
	Header string
	// Value is the header's value as given (a Delay-Duration's or
	// Delay-Deliver-At's trimmed of white space): error texts quote it.
	Value string

	// Level is a Delay-Level's level (level 0 for "0"), Clamped whether
	// its value was above the table (then Level is the highest level).
	Level   levels.Level
	Clamped bool
	// Duration is a Delay-Duration's duration, never negative.
	Duration time.Duration
	// At is a Delay-Deliver-At's time, exactly as requested (in the past
	// included).
	At time.Time
}

// ParseDelay parses the delay headers of h against table: matched
// case-insensitively, exactly one of Delay-Level, Delay-Duration and
// Delay-Deliver-At, with exactly one value. The errors, in this order:
// none of them ([levels.ErrMissingLevel]); more than one of them, or one
// given twice ([ErrInvalidDelay], or for Delay-Level given twice
// [levels.ErrInvalidLevel]); a bad Delay-Level ([levels.Table.Pick]'s
// errors); a Delay-Duration that is not a Go duration or is negative, or a
// Delay-Deliver-At that is not an RFC 3339 time ([ErrInvalidDelay]). The
// longest delay is checked by [Delay.CheckMax], against a store time.
func ParseDelay(h nats.Header, table levels.Table) (Delay, error) {
	var (
		d          Delay
		key, value string
		kinds, n   int
		seen       [3]bool
	)
	for k, v := range h {
		for i, name := range [3]string{contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt} {
			if !strings.EqualFold(k, name) {
				continue
			}
			if !seen[i] {
				seen[i], kinds, key = true, kinds+1, name
			}
			n += len(v)
			if len(v) > 0 {
				value = v[0]
			}
		}
	}
	switch {
	case kinds == 0:
		return d, fmt.Errorf("%w: no %s, %s or %s header", levels.ErrMissingLevel, contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt)
	case kinds > 1:
		return d, fmt.Errorf("%w: ambiguous: set exactly one of %s, %s and %s", ErrInvalidDelay, contract.HeaderLevel, contract.HeaderDuration, contract.HeaderDeliverAt)
	case n > 1:
		return d, fmt.Errorf("%w: %s has %d values, want one", delayErr(key), key, n)
	}
	d.Header = key
	switch key {
	case contract.HeaderLevel:
		d.Value = value
		lvl, clamped, err := table.Pick(value)
		if err != nil {
			return d, err
		}
		d.Level, d.Clamped = lvl, clamped
	case contract.HeaderDuration:
		d.Value = strings.TrimSpace(value)
		dur, err := time.ParseDuration(d.Value)
		switch {
		case err != nil:
			return d, fmt.Errorf("%w: %s %q is not a Go duration such as 90s or 36h", ErrInvalidDelay, key, d.Value)
		case dur < 0:
			return d, fmt.Errorf("%w: %s %q is negative", ErrInvalidDelay, key, d.Value)
		}
		d.Duration = dur
	default:
		d.Value = strings.TrimSpace(value)
		t, err := time.Parse(time.RFC3339Nano, d.Value)
		if err != nil {
			return d, fmt.Errorf("%w: %s %q is not an RFC 3339 time", ErrInvalidDelay, key, d.Value)
		}
		d.At = t
	}
	return d, nil
}

// Due returns the due time d asks for when stored (or requested) at
// stored: stored plus the level's delay or the duration, or the
// Delay-Deliver-At time as given (in the past included).
func (d Delay) Due(stored time.Time) time.Time {
	switch d.Header {
	case contract.HeaderDuration:
		return stored.Add(d.Duration)
	case contract.HeaderDeliverAt:
		return d.At
	}
	return stored.Add(d.Level.Delay)
}

// CheckMax checks a Delay-Duration's or Delay-Deliver-At's due against the
// longest delay maxDelay (DELAYD_MAX_DELAY) ahead of stored
// ([ErrInvalidDelay]); a Delay-Level is clamped instead, never refused.
func (d Delay) CheckMax(stored time.Time, maxDelay time.Duration) error {
	if d.Header == contract.HeaderLevel || d.Due(stored).Sub(stored) <= maxDelay {
		return nil
	}
	return fmt.Errorf("%w: %s %q is beyond the longest delay %s (DELAYD_MAX_DELAY)", ErrInvalidDelay, d.Header, d.Value, levels.FormatDuration(maxDelay))
}

// delayErr is the sentinel for a bad value of the delay header key:
// [levels.ErrInvalidLevel] for Delay-Level, [ErrInvalidDelay] for the others.
func delayErr(key string) error {
	if key == contract.HeaderLevel {
		return levels.ErrInvalidLevel
	}
	return ErrInvalidDelay
}
