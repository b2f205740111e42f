package index

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestRecordsRoundTrip(t *testing.T) {
	t.Parallel()
	due := time.Unix(0, 1795990500277234903)
	recs := []Record{
		{Key: SeqKey(42), Stream: "DELAYD_5S", Seq: 7, Due: due, Target: "orders.close"},
		{Key: UserKey("order 42\nwith a newline, ünïcode and spaces "), Stream: "DELAYD_1M30S", Seq: 1 << 40, Hop: true, Due: due},
		{Key: MergeKey("orders.close", "user-42"), Stream: "DELAYD_2H", Seq: 1, Due: due},
		{Key: UserKey("cancelled"), Gone: true, Due: due, Target: "billing.charge"},
		{Key: UserKey(""), Stream: "DELAYD_0S", Seq: 0, Due: time.Unix(0, 0)},
	}
	var packed []byte
	for _, r := range recs {
		packed = r.AppendTo(packed)
	}
	var got []Record
	DecodeRecords(packed, func(r Record) { got = append(got, r) })
	if len(got) != len(recs) {
		t.Fatalf("decoded %d records, want %d", len(got), len(recs))
	}
	for i, r := range recs {
		if !sameRecord(got[i], r) {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], r)
		}
	}
}

// TestRecordsWithoutTarget: records written before records carried
// the target (5 fields) still decode, with no target, next to new ones.
func TestRecordsWithoutTarget(t *testing.T) {
	t.Parallel()
	old := []byte("DELAYD_5S 7 - 5 3\ns42 0 c 9 4\nuabc")
	packed := Record{Key: UserKey("x"), Stream: "DELAYD_1S", Seq: 2, Due: time.Unix(0, 1), Target: "orders.close"}.AppendTo(old)
	var got []Record
	DecodeRecords(packed, func(r Record) { got = append(got, r) })
	want := []Record{
		{Key: SeqKey(42), Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)},
		{Key: UserKey("abc"), Gone: true, Due: time.Unix(0, 9)},
		{Key: UserKey("x"), Stream: "DELAYD_1S", Seq: 2, Due: time.Unix(0, 1), Target: "orders.close"},
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d records, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if !sameRecord(got[i], w) {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], w)
		}
	}
}

func TestSubjectBounded(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := range 100000 {
		s := Subject(UserKey(strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune(i))))
		if !strings.HasPrefix(s, subjectPrefix) {
			t.Fatalf("subject %q outside %s", s, subjectPrefix)
		}
		seen[s] = true
	}
	if len(seen) > Slots {
		t.Fatalf("%d subjects, want at most %d", len(seen), Slots)
	}
	if len(seen) < Slots/2 {
		t.Errorf("only %d of %d slots used: a poor spread", len(seen), Slots)
	}
}

// TestRecordWire pins the records' wire form byte for byte, as delayd
// wrote it before this package existed: records already stored must keep
// decoding, and a mixed-version deployment must read each other's. A zero
// Due (a "left delayd" record) is written as Go's UnixNano of the zero
// time, and At is never written.
func TestRecordWire(t *testing.T) {
	t.Parallel()
	due := time.Unix(0, 1795990500277234903)
	tests := []struct {
		name string
		rec  Record
		want string
	}{
		{"placed, with target", Record{Key: SeqKey(42), Stream: "DELAYD_5S", Seq: 7, Due: due, Target: "orders.close"},
			"DELAYD_5S 7 - 1795990500277234903 3 orders.close\ns42"},
		{"hop, key with newline and spaces", Record{Key: UserKey("order 42\nwith spaces "), Stream: "DELAYD_1M30S", Seq: 1 << 40, Hop: true, Due: due},
			"DELAYD_1M30S 1099511627776 h 1795990500277234903 22\nuorder 42\nwith spaces "},
		{"merge key", Record{Key: MergeKey("orders.close", "user-42"), Stream: "DELAYD_2H", Seq: 1, Due: due},
			"DELAYD_2H 1 - 1795990500277234903 21\nmorders.close\x00user-42"},
		{"cancelled", Record{Key: UserKey("x"), Gone: true, Due: due, Target: "billing.charge"},
			" 0 c 1795990500277234903 2 billing.charge\nux"},
		{"hop and gone: hop wins", Record{Key: UserKey("both"), Stream: "DELAYD_1S", Seq: 3, Hop: true, Gone: true, Due: due},
			"DELAYD_1S 3 h 1795990500277234903 5\nuboth"},
		{"left delayd, zero due", Record{Key: UserKey("left"), Target: "orders.close"},
			" 0 - -6795364578871345152 5 orders.close\nuleft"},
		{"extremes, At not written", Record{Key: SeqKey(math.MaxUint64), Stream: "DELAYD_1MS", Seq: math.MaxUint64, Due: time.Unix(0, math.MinInt64), At: 99},
			"DELAYD_1MS 18446744073709551615 - -9223372036854775808 21\ns18446744073709551615"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := string(tt.rec.AppendTo([]byte("prefix|"))); got != "prefix|"+tt.want {
				t.Errorf("AppendTo = %q, want %q", got, "prefix|"+tt.want)
			}
			m := tt.rec.Msg()
			if string(m.Data) != tt.want || m.Subject != Subject(tt.rec.Key) {
				t.Errorf("Msg = %q on %q, want %q on %q", m.Data, m.Subject, tt.want, Subject(tt.rec.Key))
			}
		})
	}
}

// TestKeysAndSubjects pins the key forms and the slot of a key (the FNV-1a
// hash of the key, modulo Slots) as delayd computed them before this
// package existed: a lookup after an upgrade must read the slot where the
// record was written.
func TestKeysAndSubjects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key, wantKey, subject string
		merge                 bool
	}{
		{UserKey("order-42"), "uorder-42", "delayd.idx.185", false},
		{SeqKey(42), "s42", "delayd.idx.240", false},
		{MergeKey("orders.close", "user-42"), "morders.close\x00user-42", "delayd.idx.7", true},
		{UserKey(""), "u", "delayd.idx.240", false},
		{UserKey("7"), "u7", "delayd.idx.37", false},
		{SeqKey(7), "s7", "delayd.idx.175", false},
	}
	for _, tt := range tests {
		if tt.key != tt.wantKey {
			t.Errorf("key %q, want %q", tt.key, tt.wantKey)
		}
		if got := Subject(tt.key); got != tt.subject {
			t.Errorf("Subject(%q) = %q, want %q", tt.key, got, tt.subject)
		}
		if got := IsMergeKey(tt.key); got != tt.merge {
			t.Errorf("IsMergeKey(%q) = %v, want %v", tt.key, got, tt.merge)
		}
	}
}

// TestDecodeRecords: what each input decodes to, exactly. Decoding stops
// at the first malformed record, keeping the ones before it.
func TestDecodeRecords(t *testing.T) {
	t.Parallel()
	const rec = "DELAYD_5S 7 - 5 3 orders.close\nu42" // a well-formed record
	want := Record{Key: "u42", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5), Target: "orders.close"}
	tests := []struct {
		name string
		in   string
		want []Record
	}{
		{"empty", "", nil},
		{"one record", rec, []Record{want}},
		{"old record: five fields, no target", "DELAYD_5S 7 - 5 3\nu42", []Record{{Key: "u42", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}}},
		{"old and new packed", "DELAYD_1S 1 h 2 2\nu1" + rec, []Record{{Key: "u1", Stream: "DELAYD_1S", Seq: 1, Hop: true, Due: time.Unix(0, 2)}, want}},
		{"cancelled, no stream", " 0 c 9 4\nuabc", []Record{{Key: "uabc", Gone: true, Due: time.Unix(0, 9)}}},
		{"unknown flag reads as placed", "DELAYD_5S 7 x 5 3\nu42", []Record{{Key: "u42", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}}},
		{"empty key", "DELAYD_5S 7 - 5 0\n", []Record{{Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}}},
		{"key holds newlines and spaces", "DELAYD_5S 7 - 5 5\nua\n b" + rec, []Record{{Key: "ua\n b", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}, want}},
		{"negative due", "DELAYD_5S 7 - -5 3\nu42", []Record{{Key: "u42", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, -5)}}},
		{"signed due and key length", "DELAYD_5S 7 - +5 +3\nu42", []Record{{Key: "u42", Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}}},

		{"no newline", "DELAYD_5S 7 - 5 3 orders.close", nil},
		{"four fields", "DELAYD_5S 7 - 5\nu42", nil},
		{"seven fields", "DELAYD_5S 7 - 5 3 orders.close x\nu42", nil},
		{"six fields, empty target", "DELAYD_5S 7 - 5 3 \nu42", nil},
		{"sequence not a number", "DELAYD_5S x - 5 3\nu42", nil},
		{"negative sequence", "DELAYD_5S -7 - 5 3\nu42", nil},
		{"sequence beyond uint64", "DELAYD_5S 18446744073709551616 - 5 3\nu42", nil},
		{"due not a number", "DELAYD_5S 7 - soon 3\nu42", nil},
		{"key length not a number", "DELAYD_5S 7 - 5 three\nu42", nil},
		{"negative key length", "DELAYD_5S 7 - 5 -1\nu42", nil},
		{"key length beyond the data", "DELAYD_5S 7 - 5 4\nu42", nil},
		{"double space", "DELAYD_5S  7 - 5 3\nu42", nil},
		{"good, then malformed", rec + "garbage\n", []Record{want}},
		{"good, then cut short", rec + rec[:len(rec)-1], []Record{want}},
		{"malformed, then good", "garbage\n" + rec, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []Record
			DecodeRecords([]byte(tt.in), func(r Record) { got = append(got, r) })
			if len(got) != len(tt.want) {
				t.Fatalf("DecodeRecords(%q) gave %d records, want %d: %+v", tt.in, len(got), len(tt.want), got)
			}
			for i := range got {
				if !sameRecord(got[i], tt.want[i]) {
					t.Errorf("record %d: got %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// FuzzDecodeRecords: decoding arbitrary bytes never panics, and what it
// accepts survives a round trip: re-encoded and decoded again, the records
// are the same, and encoding those gives the same bytes.
func FuzzDecodeRecords(f *testing.F) {
	f.Add(Record{Key: SeqKey(42), Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}.AppendTo(nil))
	f.Add(Record{Key: UserKey("a\nb c"), Stream: "DELAYD_1S", Seq: 1, Hop: true, Due: time.Unix(0, math.MinInt64), Target: "orders.close"}.AppendTo(nil))
	f.Add(Record{Key: MergeKey("orders.close", "ünïcode ✓"), Stream: "DELAYD_2H", Seq: 9, Gone: true, Due: time.Unix(0, 9)}.AppendTo(nil))
	f.Add([]byte("DELAYD_5S 7 - 5 999\nab"))
	f.Add([]byte("DELAYD_5S 7 - 5 -1\nab"))
	f.Add([]byte(" 0 c 0 2\nix"))
	f.Add([]byte("DELAYD_5S 007 x +5 2 orders.close\nix"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var recs []Record
		var again []byte
		DecodeRecords(data, func(r Record) {
			recs = append(recs, r)
			again = r.AppendTo(again)
		})
		var recs2 []Record
		var twice []byte
		DecodeRecords(again, func(r Record) {
			recs2 = append(recs2, r)
			twice = r.AppendTo(twice)
		})
		if len(recs2) != len(recs) {
			t.Fatalf("%d records decoded from %q, %d after re-encoding as %q", len(recs), data, len(recs2), again)
		}
		for i := range recs {
			if !sameRecord(recs[i], recs2[i]) {
				t.Fatalf("record %d: %+v, after re-encoding %+v", i, recs[i], recs2[i])
			}
		}
		if string(again) != string(twice) {
			t.Fatalf("re-encoding is not stable: %q then %q", again, twice)
		}
	})
}

// sameRecord reports whether a and b have the same fields, Due compared
// as an instant.
func sameRecord(a, b Record) bool {
	return a.Key == b.Key && a.Stream == b.Stream && a.Seq == b.Seq && a.Hop == b.Hop && a.Gone == b.Gone &&
		a.Due.Equal(b.Due) && a.At == b.At && a.Target == b.Target
}
