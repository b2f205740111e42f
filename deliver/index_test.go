package deliver

import (
	"strings"
	"testing"
	"time"
)

func TestIndexRecordsRoundTrip(t *testing.T) {
	t.Parallel()
	due := time.Unix(0, 1795990500277234903)
	recs := []indexRecord{
		{key: seqKey(42), stream: "DELAYD_5S", seq: 7, due: due},
		{key: userKey("order 42\nwith a newline, ünïcode and spaces "), stream: "DELAYD_1M30S", seq: 1 << 40, hop: true, due: due},
		{key: mergeKey("orders.close", "user-42"), stream: "DELAYD_2H", seq: 1, due: due},
		{key: userKey("cancelled"), gone: true, due: due},
		{key: userKey(""), stream: "DELAYD_0S", seq: 0, due: time.Unix(0, 0)},
	}
	var packed []byte
	for _, r := range recs {
		packed = r.appendTo(packed)
	}
	var got []indexRecord
	decodeIndexRecords(packed, func(r indexRecord) { got = append(got, r) })
	if len(got) != len(recs) {
		t.Fatalf("decoded %d records, want %d", len(got), len(recs))
	}
	for i, r := range recs {
		g := got[i]
		if g.key != r.key || g.stream != r.stream || g.seq != r.seq || g.hop != r.hop || g.gone != r.gone || !g.due.Equal(r.due) {
			t.Errorf("record %d: got %+v, want %+v", i, g, r)
		}
	}
}

func TestIndexSubjectBounded(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := range 100000 {
		s := indexSubject(userKey(strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune(i))))
		if !strings.HasPrefix(s, indexSubjects) {
			t.Fatalf("subject %q outside %s", s, indexSubjects)
		}
		seen[s] = true
	}
	if len(seen) > IndexSlots {
		t.Fatalf("%d subjects, want at most %d", len(seen), IndexSlots)
	}
	if len(seen) < IndexSlots/2 {
		t.Errorf("only %d of %d slots used: a poor spread", len(seen), IndexSlots)
	}
}

// FuzzIndexRecords: decoding arbitrary bytes never panics, and records
// that decode re-encode to the same bytes.
func FuzzIndexRecords(f *testing.F) {
	f.Add(indexRecord{key: seqKey(42), stream: "DELAYD_5S", seq: 7, due: time.Unix(0, 5)}.appendTo(nil))
	f.Add([]byte("DELAYD_5S 7 - 5 999\nab"))
	f.Add([]byte("DELAYD_5S 7 - 5 -1\nab"))
	f.Add([]byte(" 0 c 0 2\nix"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var again []byte
		decodeIndexRecords(data, func(r indexRecord) { again = r.appendTo(again) })
		var twice []byte
		decodeIndexRecords(again, func(r indexRecord) { twice = r.appendTo(twice) })
		if string(again) != string(twice) {
			t.Fatalf("re-encoding is not stable: %q then %q", again, twice)
		}
	})
}
