package levels

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	t.Parallel()

	want := []string{
		"DELAYD_1S", "DELAYD_5S", "DELAYD_10S", "DELAYD_30S", "DELAYD_1M", "DELAYD_2M", "DELAYD_3M", "DELAYD_4M",
		"DELAYD_5M", "DELAYD_6M", "DELAYD_7M", "DELAYD_8M", "DELAYD_9M", "DELAYD_10M", "DELAYD_20M", "DELAYD_30M",
		"DELAYD_1H", "DELAYD_2H",
	}
	table := Default()
	if table.Len() != 18 {
		t.Fatalf("Len() = %d, want 18", table.Len())
	}
	var got []string
	for i, lvl := range table.Levels() {
		if lvl.Index != i+1 {
			t.Errorf("Levels()[%d].Index = %d, want %d", i, lvl.Index, i+1)
		}
		got = append(got, lvl.Stream())
	}
	if !slices.Equal(got, want) {
		t.Errorf("streams = %v, want %v", got, want)
	}
	if table.String() != DefaultTable {
		t.Errorf("String() = %q, want %q", table.String(), DefaultTable)
	}
	if max := table.Max(); max.Index != 18 || max.Delay != 2*time.Hour {
		t.Errorf("Max() = %+v, want {18 2h}", max)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		text    string
		streams []string // stream names, when Parse succeeds
		delays  []time.Duration
		str     string // String(), when Parse succeeds
		err     error  // sentinel, when Parse fails
		errText string // substring of the error, when Parse fails
	}{
		{name: "every unit", text: "100ms 2s 3m 4h 5d",
			streams: []string{"DELAYD_100MS", "DELAYD_2S", "DELAYD_3M", "DELAYD_4H", "DELAYD_120H"},
			delays:  []time.Duration{100 * time.Millisecond, 2 * time.Second, 3 * time.Minute, 4 * time.Hour, 120 * time.Hour},
			str:     "100ms 2s 3m 4h 120h"},
		{name: "90s", text: "90s", streams: []string{"DELAYD_1M30S"}, str: "1m30s"},
		{name: "1m30s", text: "1m30s", streams: []string{"DELAYD_1M30S"}, str: "1m30s"},
		{name: "1d", text: "1d", streams: []string{"DELAYD_24H"}, str: "24h"},
		{name: "1d12h", text: "1d12h", streams: []string{"DELAYD_36H"}, str: "36h"},
		{name: "100ms", text: "100ms", streams: []string{"DELAYD_100MS"}, str: "100ms"},
		{name: "decimal", text: "1.5s 2.5m", streams: []string{"DELAYD_1_5S", "DELAYD_2M30S"}, str: "1.5s 2m30s"},
		{name: "inner zero unit", text: "1h0m30s", streams: []string{"DELAYD_1H0M30S"}, str: "1h0m30s"},
		{name: "1h30m", text: "90m", streams: []string{"DELAYD_1H30M"}, str: "1h30m"},
		{name: "extra whitespace", text: "  1s \t 5s\n\n10s  \r\n", streams: []string{"DELAYD_1S", "DELAYD_5S", "DELAYD_10S"},
			str: "1s 5s 10s"},

		{name: "empty", text: "", err: ErrEmptyTable},
		{name: "whitespace only", text: " \t\n ", err: ErrEmptyTable},
		{name: "same text twice", text: "1s 1s", err: ErrDuplicate, errText: `"1s" (level 2) is the same delay as "1s" (level 1)`},
		{name: "two spellings", text: "90s 1m30s", err: ErrDuplicate, errText: `"1m30s" (level 2) is the same delay as "90s" (level 1)`},
		{name: "duplicate not adjacent", text: "1s 5s 1s", err: ErrDuplicate},
		{name: "decreasing", text: "1s 10s 5s", err: ErrNotIncreasing, errText: `"5s" (level 3)`},
		{name: "zero", text: "0s", err: ErrBadDuration, errText: "greater than 0"},
		{name: "bare zero", text: "1s 0", err: ErrBadDuration, errText: `"0" (level 2)`},
		{name: "negative", text: "-1s", err: ErrBadDuration, errText: "greater than 0"},
		{name: "unknown unit", text: "1s 5s 1x", err: ErrBadDuration, errText: `levels: "1x" (level 3): unknown unit "x"`},
		{name: "go-only unit", text: "1us", err: ErrBadDuration, errText: `unknown unit "us"`},
		{name: "no unit", text: "5", err: ErrBadDuration, errText: "missing unit"},
		{name: "sub-ms", text: "0.5ms", err: ErrBadDuration, errText: "whole number of milliseconds"},
		{name: "sub-ms in seconds", text: "1.0005s", err: ErrBadDuration, errText: "whole number of milliseconds"},
		{name: "no number", text: "s", err: ErrBadDuration, errText: "expected a number"},
		{name: "overflow", text: "3000000h", err: ErrBadDuration, errText: "out of range"},
		{name: "comma", text: "1s,5s", err: ErrBadDuration},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			table, err := Parse(tt.text)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Parse(%q) error = %v, want %v", tt.text, err, tt.err)
				}
				if !strings.Contains(err.Error(), tt.errText) {
					t.Errorf("Parse(%q) error = %q, want it to contain %q", tt.text, err, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.text, err)
			}
			var streams []string
			var delays []time.Duration
			for _, lvl := range table.Levels() {
				streams = append(streams, lvl.Stream())
				delays = append(delays, lvl.Delay)
			}
			if !slices.Equal(streams, tt.streams) {
				t.Errorf("streams = %v, want %v", streams, tt.streams)
			}
			if tt.delays != nil && !slices.Equal(delays, tt.delays) {
				t.Errorf("delays = %v, want %v", delays, tt.delays)
			}
			if table.String() != tt.str {
				t.Errorf("String() = %q, want %q", table.String(), tt.str)
			}
		})
	}
}

func TestMustParsePanics(t *testing.T) {
	t.Parallel()

	defer func() {
		if recover() == nil {
			t.Error("MustParse(\"\") did not panic")
		}
	}()
	MustParse("")
}

func TestDecode(t *testing.T) {
	t.Parallel()

	table := MustParse("1s")
	if err := table.Decode("2s 3s"); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if table.String() != "2s 3s" {
		t.Errorf("after Decode, String() = %q, want %q", table.String(), "2s 3s")
	}
	if err := table.Decode("3s 2s"); !errors.Is(err, ErrNotIncreasing) {
		t.Errorf("Decode(%q) error = %v, want %v", "3s 2s", err, ErrNotIncreasing)
	}
	if table.String() != "2s 3s" {
		t.Errorf("after failed Decode, String() = %q, want it unchanged", table.String())
	}
}

func TestTableLevel(t *testing.T) {
	t.Parallel()

	table := MustParse("1s 5s")
	tests := []struct {
		index int
		want  Level
		ok    bool
	}{
		{index: 0, want: Level{}, ok: true},
		{index: 1, want: Level{Index: 1, Delay: time.Second}, ok: true},
		{index: 2, want: Level{Index: 2, Delay: 5 * time.Second}, ok: true},
		{index: 3, ok: false},
		{index: -1, ok: false},
	}
	for _, tt := range tests {
		got, ok := table.Level(tt.index)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Level(%d) = %+v, %v; want %+v, %v", tt.index, got, ok, tt.want, tt.ok)
		}
	}
	if name := (Level{}).Name(); name != "0S" {
		t.Errorf("immediate Name() = %q, want %q", name, "0S")
	}
	if stream := (Level{}).Stream(); stream != "DELAYD_0S" {
		t.Errorf("immediate Stream() = %q, want %q", stream, "DELAYD_0S")
	}
}

func TestZeroTable(t *testing.T) {
	t.Parallel()

	var table Table
	if table.Len() != 0 || len(table.Levels()) != 0 || table.Max() != (Level{}) || table.String() != "" {
		t.Errorf("zero Table is not empty: Len %d, Levels %v, Max %+v, String %q",
			table.Len(), table.Levels(), table.Max(), table.String())
	}
	if lvl, _, err := table.Pick("0"); err != nil || lvl != (Level{}) {
		t.Errorf("zero Table Pick(\"0\") = %+v, %v; want the immediate level", lvl, err)
	}
	if _, _, err := table.Pick("1"); !errors.Is(err, ErrEmptyTable) {
		t.Errorf("zero Table Pick(\"1\") error = %v, want %v", err, ErrEmptyTable)
	}
}

func TestLevelsIsACopy(t *testing.T) {
	t.Parallel()

	table := MustParse("1s 5s")
	table.Levels()[0].Delay = time.Hour
	if lvl, _ := table.Level(1); lvl.Delay != time.Second {
		t.Errorf("changing Levels() changed the table: level 1 = %v", lvl.Delay)
	}
}

func TestPick(t *testing.T) {
	t.Parallel()

	table := Default()
	tests := []struct {
		value   string
		want    Level
		clamped bool
		err     error
	}{
		{value: "0", want: Level{}},
		{value: "1", want: Level{Index: 1, Delay: time.Second}},
		{value: "18", want: Level{Index: 18, Delay: 2 * time.Hour}},
		{value: "19", want: Level{Index: 18, Delay: 2 * time.Hour}, clamped: true},
		{value: "9223372036854775807", want: Level{Index: 18, Delay: 2 * time.Hour}, clamped: true},
		{value: " 3 ", want: Level{Index: 3, Delay: 10 * time.Second}},
		{value: "\t3\r\n", want: Level{Index: 3, Delay: 10 * time.Second}},
		{value: "+3", want: Level{Index: 3, Delay: 10 * time.Second}},
		{value: "03", want: Level{Index: 3, Delay: 10 * time.Second}},
		{value: "-0", want: Level{}},
		{value: "-1", err: ErrInvalidLevel},
		{value: "abc", err: ErrInvalidLevel},
		{value: "1.5", err: ErrInvalidLevel},
		{value: "+-1", err: ErrInvalidLevel},
		{value: "1 2", err: ErrInvalidLevel},
		{value: "0x10", err: ErrInvalidLevel},
		{value: "1_0", err: ErrInvalidLevel},
		{value: "", err: ErrMissingLevel},
		{value: "   ", err: ErrMissingLevel},
		{value: "99999999999999999999", err: ErrLevelOverflow},
		{value: "-99999999999999999999", err: ErrLevelOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			t.Parallel()

			got, clamped, err := table.Pick(tt.value)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Pick(%q) error = %v, want %v", tt.value, err, tt.err)
				}
				if !strings.Contains(err.Error(), `"`+tt.value+`"`) {
					t.Errorf("Pick(%q) error = %q, want it to quote the value", tt.value, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Pick(%q): %v", tt.value, err)
			}
			if got != tt.want || clamped != tt.clamped {
				t.Errorf("Pick(%q) = %+v, %v; want %+v, %v", tt.value, got, clamped, tt.want, tt.clamped)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()

	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{in: "0", want: 0},
		{in: "1ms", want: time.Millisecond},
		{in: "1s", want: time.Second},
		{in: "1m", want: time.Minute},
		{in: "1h", want: time.Hour},
		{in: "1d", want: 24 * time.Hour},
		{in: "1d12h", want: 36 * time.Hour},
		{in: "1h30m15s250ms", want: time.Hour + 30*time.Minute + 15*time.Second + 250*time.Millisecond},
		{in: "1.5s", want: 1500 * time.Millisecond},
		{in: ".5s", want: 500 * time.Millisecond},
		{in: "5.s", want: 5 * time.Second},
		{in: "0.5ms", want: 500 * time.Microsecond},
		{in: "-1.5h", want: -90 * time.Minute},
		{in: "+2m", want: 2 * time.Minute},
		{in: "2562047h47m16.854775807s", want: time.Duration(1<<63 - 1)},
		{in: "-2562047h47m16.854775808s", want: time.Duration(-1 << 63)},
		{in: "2562047h47m16.854775808s", err: true},
		{in: "0.0000000001s", err: true},
		{in: "", err: true},
		{in: "-", err: true},
		{in: "5", err: true},
		{in: ".s", err: true},
		{in: "1ns", err: true},
		{in: "1µs", err: true},
		{in: "1y", err: true},
		{in: "1S", err: true},
		{in: "1 s", err: true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if tt.err {
			if !errors.Is(err, ErrBadDuration) {
				t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, ErrBadDuration)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()

	tests := []struct {
		in   time.Duration
		want string
		name string
	}{
		{in: 0, want: "0s", name: "0S"},
		{in: 100 * time.Millisecond, want: "100ms", name: "100MS"},
		{in: 1500 * time.Millisecond, want: "1.5s", name: "1_5S"},
		{in: 90 * time.Second, want: "1m30s", name: "1M30S"},
		{in: 10 * time.Minute, want: "10m", name: "10M"},
		{in: 90 * time.Minute, want: "1h30m", name: "1H30M"},
		{in: 2 * time.Hour, want: "2h", name: "2H"},
		{in: 24 * time.Hour, want: "24h", name: "24H"},
		{in: time.Hour + 30*time.Second, want: "1h0m30s", name: "1H0M30S"},
		{in: time.Minute + 500*time.Millisecond, want: "1m0.5s", name: "1M0_5S"},
	}
	for _, tt := range tests {
		if got := FormatDuration(tt.in); got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.in, got, tt.want)
		}
		if got := DurationName(tt.in); got != tt.name {
			t.Errorf("DurationName(%v) = %q, want %q", tt.in, got, tt.name)
		}
		if got := StreamName(tt.in); got != StreamPrefix+tt.name {
			t.Errorf("StreamName(%v) = %q, want %q", tt.in, got, StreamPrefix+tt.name)
		}
	}
}

func TestParseStreamName(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		want time.Duration
		ok   bool
	}{
		{name: "DELAYD_1M30S", want: 90 * time.Second, ok: true},
		{name: "DELAYD_0S", want: 0, ok: true},
		{name: "DELAYD_100MS", want: 100 * time.Millisecond, ok: true},
		{name: "DELAYD_1_5S", want: 1500 * time.Millisecond, ok: true},
		{name: "DELAYD_24H", want: 24 * time.Hour, ok: true},
		{name: "DELAYD_1H0M30S", want: time.Hour + 30*time.Second, ok: true},
		{name: "DELAYD_INGRESS"},
		{name: "DELAYD_DLQ"},
		{name: "DELAYD_OFFSETS"},
		{name: "FOO"},
		{name: "DELAYD_"},
		{name: "DELAYD_90S"},   // not canonical: StreamName(90s) is DELAYD_1M30S
		{name: "DELAYD_1D"},    // not canonical: DELAYD_24H
		{name: "DELAYD_1M0S"},  // not canonical: DELAYD_1M
		{name: "DELAYD_1.5S"},  // not canonical: DELAYD_1_5S
		{name: "DELAYD_5s"},    // lower case
		{name: "DELAYD_+5S"},   // sign
		{name: "DELAYD_-5S"},   // negative
		{name: "DELAYD_0_5MS"}, // sub-millisecond
		{name: "delayd_5S"},
	}
	for _, tt := range tests {
		got, ok := ParseStreamName(tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseStreamName(%q) = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestStreamNameRoundTrip(t *testing.T) {
	t.Parallel()

	delays := []time.Duration{0}
	for _, lvl := range Default().Levels() {
		delays = append(delays, lvl.Delay)
	}
	for _, ms := range []int64{1, 7, 999, 1001, 1500, 59_999, 61_001, 3_599_999, 3_600_001, 86_400_000, 90_061_001, 1<<63/1_000_000 - 1} {
		delays = append(delays, time.Duration(ms)*time.Millisecond)
	}
	for _, d := range delays {
		name := StreamName(d)
		got, ok := ParseStreamName(name)
		if !ok || got != d {
			t.Errorf("ParseStreamName(StreamName(%v) = %q) = %v, %v; want %v, true", d, name, got, ok, d)
		}
		if strings.ContainsAny(name, " \t\r\n\f.*>/\\") {
			t.Errorf("StreamName(%v) = %q is not a valid stream name", d, name)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		DefaultTable, "", " ", "1s 1s", "90s 1m30s", "5s 1s", "0s", "-1s", "1x", "5", "0.5ms", "1.5s", "1d12h",
		"100ms 1s\t1m\n1h 1d", "1h0m30s", ".5s", "5.s", "2562047h47m16.854s", "1e3s", "1s5", "𝟙s",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		table, err := Parse(text)
		if err != nil {
			if !errors.Is(err, ErrEmptyTable) && !errors.Is(err, ErrBadDuration) &&
				!errors.Is(err, ErrDuplicate) && !errors.Is(err, ErrNotIncreasing) {
				t.Fatalf("Parse(%q) error %v wraps no sentinel", text, err)
			}
			return
		}
		levels := table.Levels()
		if len(levels) == 0 || len(levels) != table.Len() {
			t.Fatalf("Parse(%q) = %d levels, Len %d", text, len(levels), table.Len())
		}
		for i, lvl := range levels {
			if lvl.Index != i+1 || lvl.Delay <= 0 || lvl.Delay%time.Millisecond != 0 {
				t.Fatalf("Parse(%q) level %d = %+v", text, i+1, lvl)
			}
			if i > 0 && lvl.Delay <= levels[i-1].Delay {
				t.Fatalf("Parse(%q) is not strictly increasing at level %d", text, i+1)
			}
			if d, ok := ParseStreamName(lvl.Stream()); !ok || d != lvl.Delay {
				t.Fatalf("ParseStreamName(%q) = %v, %v; want %v", lvl.Stream(), d, ok, lvl.Delay)
			}
		}
		again, err := Parse(table.String())
		if err != nil {
			t.Fatalf("Parse(String() = %q): %v", table.String(), err)
		}
		if !slices.Equal(again.Levels(), levels) {
			t.Fatalf("Parse(String() = %q) = %v, want %v", table.String(), again.Levels(), levels)
		}
	})
}

func FuzzPick(f *testing.F) {
	for _, seed := range []string{"0", "1", "18", "19", "-1", "abc", "", " 3 ", "99999999999999999999", "1.5", "+-1", "+3"} {
		f.Add(seed)
	}
	table := Default()
	f.Fuzz(func(t *testing.T, value string) {
		lvl, clamped, err := table.Pick(value)
		if err != nil {
			if !errors.Is(err, ErrMissingLevel) && !errors.Is(err, ErrInvalidLevel) && !errors.Is(err, ErrLevelOverflow) {
				t.Fatalf("Pick(%q) error %v wraps no sentinel", value, err)
			}
			return
		}
		want, ok := table.Level(lvl.Index)
		if !ok || want != lvl {
			t.Fatalf("Pick(%q) = %+v, not a level of the table", value, lvl)
		}
		if clamped && lvl != table.Max() {
			t.Fatalf("Pick(%q) clamped to %+v, want Max %+v", value, lvl, table.Max())
		}
	})
}

func TestPrecisionLevels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		table string
		want  []time.Duration
	}{
		{"1s 5s", []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}},
		{"100ms 1s", []time.Duration{1, 2, 4, 8, 16, 32, 64}},
		{"2ms 1s", []time.Duration{1}},
		{"1ms 1s", nil},
	} {
		tab, err := Parse(tc.table)
		if err != nil {
			t.Fatal(err)
		}
		got := tab.PrecisionLevels()
		if len(got) != len(tc.want) {
			t.Fatalf("%q: %d precision levels %v, want %d", tc.table, len(got), got, len(tc.want))
		}
		for i, l := range got {
			if l.Delay != tc.want[i]*time.Millisecond || l.Index != tab.Len()+1+i {
				t.Errorf("%q: precision level %d = %+v, want delay %s index %d", tc.table, i, l, tc.want[i]*time.Millisecond, tab.Len()+1+i)
			}
			if _, ok := ParseStreamName(l.Stream()); !ok {
				t.Errorf("%q: stream name %q does not parse", tc.table, l.Stream())
			}
		}
	}
}
