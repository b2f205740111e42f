// Package levels holds delayd's delay-level table: parsing it, naming each level's stream, and choosing the level for
// one Delay-Level header value. It does no I/O.
//
// The semantics follow RocketMQ 4's ScheduleMessageService delay levels (messageDelayLevel): a table of fixed delays
// indexed from 1, level 0 meaning "not a delay message", and a level above the highest one clamped to the highest.
// Unlike RocketMQ, a level's stream is named by its delay, not its index (see [StreamName]), so changing the table never
// mixes delays.
package levels

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultTable is the default level table text: RocketMQ 4's 18 default delay levels.
const DefaultTable = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

// StreamPrefix starts the name of every JetStream stream delayd creates, level streams included.
const StreamPrefix = "DELAYD_"

// Level is one delay level.
type Level struct {
	// Index is the level's 1-based index in the table. 0 is the immediate level (RocketMQ: not a delay message).
	Index int
	// Delay is the level's delay; due = ingress stored time + Delay. It is 0 for Index 0.
	Delay time.Duration
}

// Name returns the level's subject-token form, [DurationName] of its delay: "5S", "1M30S", "100MS"; "0S" for the
// immediate level.
func (l Level) Name() string { return DurationName(l.Delay) }

// Stream returns the name of the level's JetStream stream, [StreamName] of its delay: "DELAYD_5S".
func (l Level) Stream() string { return StreamName(l.Delay) }

// PrecisionMin is the shortest precision level: 1 ms.
const PrecisionMin = time.Millisecond

// PrecisionLevels returns the precision levels below the table's shortest
// level: 1 ms, 2 ms, 4 ms, ... up to the last power of two shorter than the
// shortest level (1 ms to 512 ms below the default 1 s), with Index
// [Table.Len]+1 onwards. They are not in the table and no publisher names
// them. A cascading message's last stretch, shorter than every level of the
// table, moves through them, longest first (a binary decomposition of what
// remains), so that it waits in FIFO levels of one delay each, as every
// level does, instead of behind messages due later in the shortest level.
// This is what makes any delay late by milliseconds, not by up to the
// shortest level.
//
// A table [Table.WithoutPrecision] has none.
func (t Table) PrecisionLevels() []Level {
	if len(t.delays) == 0 || t.noPrecision {
		return nil
	}
	var out []Level
	for d := PrecisionMin; d < t.delays[0]; d *= 2 {
		out = append(out, Level{Index: len(t.delays) + 1 + len(out), Delay: d})
	}
	return out
}

// Table is an immutable, strictly increasing list of level delays; level i (1-based) has the i-th delay. The zero value
// is an empty table, which [Parse] never returns.
type Table struct {
	delays      []time.Duration
	noPrecision bool // see WithoutPrecision
}

// WithoutPrecision returns the table without precision levels ([Table.PrecisionLevels] is empty): a cascading
// message's last stretch, shorter than the shortest level, then waits in the shortest level itself, which hands it
// off at its due time or once the messages stored before it there are handed off, whichever is later. It is never
// early, and late by less than the shortest level's delay (less what remained), where the precision levels make it
// late by milliseconds. It saves one stream per precision level (10 below the default 1 s level). The level
// table itself ([Table.String], [Table.Levels]) is unchanged.
func (t Table) WithoutPrecision() Table {
	t.noPrecision = true
	return t
}

// Precision reports whether the table has precision levels: true unless it came from [Table.WithoutPrecision].
func (t Table) Precision() bool { return !t.noPrecision }

// Parse parses a level table: durations separated by any whitespace, for example "1s 5s 1m30s 2h". Each duration is a
// sequence of decimal numbers, each with an optional fraction and a unit: ms, s, m, h or d (d = 24h), as in "1.5s",
// "1m30s" or "1d12h". A table has at least one level; each delay is greater than 0 and a whole number of
// milliseconds, and the delays are strictly increasing.
//
// Errors wrap [ErrEmptyTable], [ErrBadDuration], [ErrDuplicate] or [ErrNotIncreasing], and name the offending token
// and its level. Two spellings of one delay ("90s 1m30s") are [ErrDuplicate], as they would share one stream.
func Parse(text string) (Table, error) {
	tokens := strings.Fields(text)
	if len(tokens) == 0 {
		return Table{}, fmt.Errorf("levels: no durations in %q (want durations separated by spaces, e.g. %q): %w",
			text, "1s 5s 10s", ErrEmptyTable)
	}
	delays := make([]time.Duration, 0, len(tokens))
	seen := make(map[time.Duration]int, len(tokens))
	for i, tok := range tokens {
		level := i + 1
		d, reason := parseDuration(tok)
		if reason != "" {
			return Table{}, fmt.Errorf("levels: %q (level %d): %s: %w", tok, level, reason, ErrBadDuration)
		}
		if reason := checkDelay(d); reason != "" {
			return Table{}, fmt.Errorf("levels: %q (level %d): %s: %w", tok, level, reason, ErrBadDuration)
		}
		if prev, ok := seen[d]; ok {
			return Table{}, fmt.Errorf("levels: %q (level %d) is the same delay as %q (level %d): %w",
				tok, level, tokens[prev-1], prev, ErrDuplicate)
		}
		if i > 0 && d < delays[i-1] {
			return Table{}, fmt.Errorf("levels: %q (level %d) is smaller than %q (level %d); levels must be strictly increasing: %w",
				tok, level, tokens[i-1], i, ErrNotIncreasing)
		}
		seen[d] = level
		delays = append(delays, d)
	}
	return Table{delays: delays}, nil
}

// checkDelay returns why d is not a valid level delay, or "".
func checkDelay(d time.Duration) string {
	switch {
	case d <= 0:
		return "must be greater than 0"
	case d%time.Millisecond != 0:
		return "must be a whole number of milliseconds"
	}
	return ""
}

// MustParse is like [Parse] but panics on error. It is for tests and [Default].
func MustParse(text string) Table {
	t, err := Parse(text)
	if err != nil {
		panic(err)
	}
	return t
}

// Default returns the table of [DefaultTable].
func Default() Table { return MustParse(DefaultTable) }

// Decode parses text with [Parse] into t, so a Table can be read by github.com/kelseyhightower/envconfig. On error t
// is left unchanged.
func (t *Table) Decode(text string) error {
	parsed, err := Parse(text)
	if err != nil {
		return err
	}
	*t = parsed
	return nil
}

// Len returns the number of levels, not counting the immediate level 0.
func (t Table) Len() int { return len(t.delays) }

// Levels returns a copy of the levels, Index 1 to [Table.Len], in order.
func (t Table) Levels() []Level {
	out := make([]Level, len(t.delays))
	for i, d := range t.delays {
		out[i] = Level{Index: i + 1, Delay: d}
	}
	return out
}

// Level returns the level with the given index: 1 to [Table.Len], or 0 for the immediate level {0, 0}. It returns
// false for any other index.
func (t Table) Level(index int) (Level, bool) {
	if index == 0 {
		return Level{}, true
	}
	if index < 0 || index > len(t.delays) {
		return Level{}, false
	}
	return Level{Index: index, Delay: t.delays[index-1]}, true
}

// Max returns the highest level, or the immediate level {0, 0} for an empty table.
func (t Table) Max() Level {
	if len(t.delays) == 0 {
		return Level{}
	}
	return Level{Index: len(t.delays), Delay: t.delays[len(t.delays)-1]}
}

// String returns the table's canonical text: each delay in [FormatDuration] form, separated by single spaces, e.g.
// "1s 5s 1m30s 2h". [Parse] of it returns an equal table.
func (t Table) String() string {
	names := make([]string, len(t.delays))
	for i, d := range t.delays {
		names[i] = FormatDuration(d)
	}
	return strings.Join(names, " ")
}

// Pick chooses the level for one Delay-Level header value, with RocketMQ semantics. Surrounding whitespace is
// trimmed. "0" is the immediate level; 1 to [Table.Len] is that level; a larger value is clamped to [Table.Max] and
// clamped is true. A leading "+" is accepted, as RocketMQ's Integer.parseInt does.
//
// Errors quote the value and wrap [ErrMissingLevel] (empty), [ErrInvalidLevel] (not a base-10 integer, or negative)
// or [ErrLevelOverflow] (does not fit in an int64). On an empty table, any value above 0 wraps [ErrEmptyTable].
func (t Table) Pick(value string) (lvl Level, clamped bool, err error) {
	v := strings.TrimSpace(value)
	if v == "" {
		return Level{}, false, fmt.Errorf("levels: %q: empty value (want 0 to %d; higher values are clamped): %w",
			value, t.Len(), ErrMissingLevel)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return Level{}, false, fmt.Errorf("levels: %q: does not fit in an int64: %w", value, ErrLevelOverflow)
		}
		return Level{}, false, fmt.Errorf("levels: %q: not a base-10 integer (want 0 to %d; higher values are clamped): %w",
			value, t.Len(), ErrInvalidLevel)
	}
	switch {
	case n < 0:
		return Level{}, false, fmt.Errorf("levels: %q: negative (want 0 to %d; higher values are clamped): %w",
			value, t.Len(), ErrInvalidLevel)
	case n == 0:
		return Level{}, false, nil
	case len(t.delays) == 0:
		return Level{}, false, fmt.Errorf("levels: %q: no delay levels: %w", value, ErrEmptyTable)
	case n > int64(len(t.delays)):
		return t.Max(), true, nil
	}
	lvl, _ = t.Level(int(n))
	return lvl, false, nil
}

// ParseDuration parses one duration of the level-table grammar (see [Parse]): units ms, s, m, h and d (d = 24h),
// decimal fractions and combinations allowed, an optional leading sign, and "0" without a unit. Unlike
// [time.ParseDuration] it rejects the units ns, us and µs, and a fraction finer than a nanosecond. It does not check
// that the result is a valid level delay. Errors wrap [ErrBadDuration].
func ParseDuration(s string) (time.Duration, error) {
	d, reason := parseDuration(s)
	if reason != "" {
		return 0, fmt.Errorf("levels: duration %q: %s: %w", s, reason, ErrBadDuration)
	}
	return d, nil
}

// FormatDuration formats d as [time.Duration.String] does, with zero trailing units dropped: 2h0m0s is "2h", 1h30m0s
// is "1h30m", 90s is "1m30s", 100ms is "100ms", 24h is "24h", 0 is "0s". Inner zero units stay: "1h0m30s".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// DurationName returns d's subject-token form: [FormatDuration] upper-cased, with '.' replaced by '_' so that it is a
// valid stream name and subject token. 90s is "1M30S", 1500ms is "1_5S", 24h is "24H", 0 is "0S".
func DurationName(d time.Duration) string {
	return strings.ReplaceAll(strings.ToUpper(FormatDuration(d)), ".", "_")
}

// StreamName returns the name of the level stream for delay d: [StreamPrefix] + [DurationName], e.g. "DELAYD_1M30S".
func StreamName(d time.Duration) string { return StreamPrefix + DurationName(d) }

// PartitionsMax is the highest partition count of a level (see [Partitions]).
const PartitionsMax = 64

// partitionSep separates a level stream's name from its partition index: "DELAYD_1M-P0".
const partitionSep = "-P"

// PartitionStreamName returns the name of partition i of the level stream for delay d: [StreamName] + "-P" + i,
// e.g. "DELAYD_1M-P0". Stream names cannot hold '.', so the partition is a suffix of the name, and of its subject
// token ("delayd.level.1M-P0.<target>").
func PartitionStreamName(d time.Duration, i int) string {
	return StreamName(d) + partitionSep + strconv.Itoa(i)
}

// ParseStream parses a level stream's name: [StreamName] of a delay, or [PartitionStreamName] of a delay and a
// partition index 0 to [PartitionsMax]-1. part is -1 for an unpartitioned level stream. It returns false for any name
// neither would produce ("DELAYD_1M-P01", "DELAYD_1M-P64", "DELAYD_INGRESS").
func ParseStream(name string) (d time.Duration, part int, ok bool) {
	base, idx, found := strings.Cut(name, partitionSep)
	d, ok = parseUnpartitioned(base)
	if !ok {
		return 0, 0, false
	}
	if !found {
		return d, -1, true
	}
	n, err := strconv.Atoi(idx)
	if err != nil || n < 0 || n >= PartitionsMax || strconv.Itoa(n) != idx {
		return 0, 0, false
	}
	return d, n, true
}

// ParseStreamName returns the delay of a level stream: "DELAYD_1M30S" returns 90s and true, "DELAYD_0S" 0 and true,
// and a partition stream "DELAYD_1M-P3" 1m and true (see [ParseStream]). It returns false for any name that
// [StreamName] or [PartitionStreamName] would not produce for a delay >= 0 of whole milliseconds, such as
// "DELAYD_INGRESS", "DELAYD_DLQ", "DELAYD_OFFSETS", "DELAYD_90S" (not canonical) or "FOO".
func ParseStreamName(name string) (time.Duration, bool) {
	d, _, ok := ParseStream(name)
	return d, ok
}

// parseUnpartitioned is the inverse of [StreamName].
func parseUnpartitioned(name string) (time.Duration, bool) {
	rest, ok := strings.CutPrefix(name, StreamPrefix)
	if !ok || rest == "" {
		return 0, false
	}
	d, reason := parseDuration(strings.ToLower(strings.ReplaceAll(rest, "_", ".")))
	if reason != "" || d < 0 || d%time.Millisecond != 0 || StreamName(d) != name {
		return 0, false
	}
	return d, true
}
