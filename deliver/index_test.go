package deliver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

func TestIndexRecordsRoundTrip(t *testing.T) {
	t.Parallel()
	due := time.Unix(0, 1795990500277234903)
	recs := []indexRecord{
		{key: seqKey(42), stream: "DELAYD_5S", seq: 7, due: due, target: "orders.close"},
		{key: userKey("order 42\nwith a newline, ünïcode and spaces "), stream: "DELAYD_1M30S", seq: 1 << 40, hop: true, due: due},
		{key: mergeKey("orders.close", "user-42"), stream: "DELAYD_2H", seq: 1, due: due},
		{key: userKey("cancelled"), gone: true, due: due, target: "billing.charge"},
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
		if g.key != r.key || g.stream != r.stream || g.seq != r.seq || g.hop != r.hop || g.gone != r.gone || !g.due.Equal(r.due) || g.target != r.target {
			t.Errorf("record %d: got %+v, want %+v", i, g, r)
		}
	}
}

// TestIndexRecordsWithoutTarget: records written before records carried
// the target (5 fields) still decode, with no target, next to new ones.
func TestIndexRecordsWithoutTarget(t *testing.T) {
	t.Parallel()
	old := []byte("DELAYD_5S 7 - 5 3\ns42 0 c 9 4\nuabc")
	packed := indexRecord{key: userKey("x"), stream: "DELAYD_1S", seq: 2, due: time.Unix(0, 1), target: "orders.close"}.appendTo(old)
	var got []indexRecord
	decodeIndexRecords(packed, func(r indexRecord) { got = append(got, r) })
	want := []indexRecord{
		{key: seqKey(42), stream: "DELAYD_5S", seq: 7, due: time.Unix(0, 5)},
		{key: userKey("abc"), gone: true, due: time.Unix(0, 9)},
		{key: userKey("x"), stream: "DELAYD_1S", seq: 2, due: time.Unix(0, 1), target: "orders.close"},
	}
	if len(got) != len(want) {
		t.Fatalf("decoded %d records, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.key != w.key || g.stream != w.stream || g.seq != w.seq || g.gone != w.gone || !g.due.Equal(w.due) || g.target != w.target {
			t.Errorf("record %d: got %+v, want %+v", i, g, w)
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
	f.Add([]byte("DELAYD_5S 7 - 5 2 orders.close\nix"))
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

// TestTrimIndex purges the records stored more than keep before the
// cutoff, and everything with a zero cutoff (the server's now) and no keep;
// lookups still find what is left.
func TestTrimIndex(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx := context.Background()
	if err := ensureIndexStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	var times []time.Time
	for i := range 6 {
		ack, err := js.PublishMsg(ctx, indexRecord{key: userKey(fmt.Sprint("k", i)), stream: "DELAYD_1S", seq: uint64(i + 1)}.msg())
		if err != nil {
			t.Fatal(err)
		}
		m, err := js.Conn().Request("$JS.API.DIRECT.GET."+IndexStream, []byte(fmt.Sprintf(`{"seq":%d}`, ack.Sequence)), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get(hdrJSTimeStamp))
		times = append(times, ts)
		time.Sleep(20 * time.Millisecond)
	}
	// Keep 10 ms before the fourth record: the first three are older.
	if err := trimIndex(ctx, js, times[3], 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	reader, err := jswire.NewBatchReader(nc, indexBatch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for i := range 6 {
		_, ok, err := lookupIndex(ctx, reader, userKey(fmt.Sprint("k", i)))
		if err != nil {
			t.Fatal(err)
		}
		if ok != (i >= 3) {
			t.Errorf("record %d: found %v after the trim, want %v", i, ok, i >= 3)
		}
	}
	if err := trimIndex(ctx, js, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	info, _ := js.Stream(ctx, IndexStream)
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("%d records left after trimming at the server's now", n)
	}
}

func TestDeliveryIDStable(t *testing.T) {
	t.Parallel()
	k := hopKey("0123456789abcdef0123456789abcdef")
	m := k.newIDMAC()
	a, b := m.deliveryID("delayd-1-2"), m.deliveryID("delayd-1-3")
	if a != k.deliveryID("delayd-1-2") || a == b || !strings.HasPrefix(a, "delayd-1-2-") || len(a) != len("delayd-1-2-")+12 {
		t.Errorf("delivery ids %q, %q", a, b)
	}
	if other := hopKey("another key").deliveryID("delayd-1-2"); other == a {
		t.Errorf("the id does not depend on the key: %q", other)
	}
	if got := hopKey(nil).deliveryID("delayd-1-2"); got != "delayd-1-2" {
		t.Errorf("without a key: %q", got)
	}
}
