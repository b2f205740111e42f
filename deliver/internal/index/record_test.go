package index

import (
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

// FuzzIndexRecords: decoding arbitrary bytes never panics, and records
// that decode re-encode to the same bytes.
func FuzzIndexRecords(f *testing.F) {
	f.Add(Record{Key: SeqKey(42), Stream: "DELAYD_5S", Seq: 7, Due: time.Unix(0, 5)}.AppendTo(nil))
	f.Add([]byte("DELAYD_5S 7 - 5 999\nab"))
	f.Add([]byte("DELAYD_5S 7 - 5 -1\nab"))
	f.Add([]byte(" 0 c 0 2\nix"))
	f.Add([]byte("DELAYD_5S 7 - 5 2 orders.close\nix"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var again []byte
		DecodeRecords(data, func(r Record) { again = r.AppendTo(again) })
		var twice []byte
		DecodeRecords(again, func(r Record) { twice = r.AppendTo(twice) })
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
