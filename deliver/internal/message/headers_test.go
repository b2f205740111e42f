package message

import (
	"testing"
	"time"

	"github.com/delayd/delayd/contract"
)

// parseTimeCases are RFC 3339 times in delayd's form, near it, and not
// times at all: ParseTime must agree with time.Parse on each.
var parseTimeCases = []string{
	"2026-11-29T22:12:09.799452339Z",
	"2026-11-29T22:12:09.000000000Z",
	"0000-01-01T00:00:00.000000000Z",
	"9999-12-31T23:59:59.999999999Z",
	"2024-02-29T12:00:00.000000001Z", // leap day
	"2100-02-29T12:00:00.000000000Z", // no leap day in 2100
	"2000-02-29T12:00:00.000000000Z", // but in 2000
	"2026-02-29T12:00:00.000000000Z",
	"2026-04-31T12:00:00.000000000Z",
	"2026-13-01T12:00:00.000000000Z",
	"2026-00-01T12:00:00.000000000Z",
	"2026-01-00T12:00:00.000000000Z",
	"2026-01-01T24:00:00.000000000Z",
	"2026-01-01T23:60:00.000000000Z",
	"2026-01-01T23:59:60.000000000Z", // leap second
	"2026-01-01t23:59:59.000000000Z",
	"2026-01-01T23:59:59.000000000z",
	"2026-01-01T23:59:59,000000000Z",
	"2026-01-01T23:59:59.00000000aZ",
	"2026-01-01T23:59:59.0000000-0Z",
	"+026-01-01T23:59:59.000000000Z",
	"2026-01-01T23:59:59Z",
	"2026-01-01T23:59:59.5Z",
	"2026-01-01T23:59:59.000000000+02:00",
	"2026-01-01T23:59:59.0000000000Z",
	"0000-01-01T00:00:00.000000000Z0", // found by FuzzParseTime
	"",
	"not a time",
}

// TestParseTime: ParseTime gives what time.Parse with time.RFC3339Nano gives
// (the same instant and location, or an error for the same inputs), and
// reads delayd's own form (contract.FormatTime) back exactly.
func TestParseTime(t *testing.T) {
	t.Parallel()
	for _, v := range parseTimeCases {
		checkParseTime(t, v)
	}
	for _, at := range []time.Time{time.Now(), time.Unix(0, 0), time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", 3600))} {
		got, err := ParseTime(contract.FormatTime(at))
		if err != nil || !got.Equal(at) || got.Location() != time.UTC {
			t.Errorf("ParseTime(FormatTime(%v)) = %v, %v; want the same instant in UTC", at, got, err)
		}
	}
}

// FuzzParseTime compares ParseTime with time.Parse on any input.
func FuzzParseTime(f *testing.F) {
	for _, v := range parseTimeCases {
		f.Add(v)
	}
	f.Fuzz(checkParseTime)
}

func checkParseTime(t *testing.T, v string) {
	want, wantErr := time.Parse(time.RFC3339Nano, v)
	got, err := ParseTime(v)
	// time.Parse makes a new Location for each numeric offset: compared by
	// instant, zone name and offset, and as a whole (UTC included) where
	// its Location is time.UTC.
	gotZone, gotOff := got.Zone()
	wantZone, wantOff := want.Zone()
	if (err != nil) != (wantErr != nil) || !got.Equal(want) || gotZone != wantZone || gotOff != wantOff ||
		(want.Location() == time.UTC && got != want) {
		t.Errorf("ParseTime(%q) = %v, %v; time.Parse gives %v, %v", v, got, err, want, wantErr)
	}
}
