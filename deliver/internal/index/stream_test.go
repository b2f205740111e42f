package index

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

// TestTrim purges the records stored more than keep before the cutoff,
// and everything with a zero cutoff (the server's now) and no keep;
// lookups still find what is left.
func TestTrim(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx := context.Background()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	var times []time.Time
	for i := range 6 {
		ack, err := js.PublishMsg(ctx, Record{Key: UserKey(fmt.Sprint("k", i)), Stream: "DELAYD_1S", Seq: uint64(i + 1)}.Msg())
		if err != nil {
			t.Fatal(err)
		}
		m, err := js.Conn().Request("$JS.API.DIRECT.GET."+Stream, []byte(fmt.Sprintf(`{"seq":%d}`, ack.Sequence)), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
		times = append(times, ts)
		time.Sleep(20 * time.Millisecond)
	}
	// Keep 10 ms before the fourth record: the first three are older.
	if err := Trim(ctx, js, times[3], 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for i := range 6 {
		_, ok, err := Lookup(ctx, reader, UserKey(fmt.Sprint("k", i)), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok != (i >= 3) {
			t.Errorf("record %d: found %v after the trim, want %v", i, ok, i >= 3)
		}
	}
	if err := Trim(ctx, js, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	info, _ := js.Stream(ctx, Stream)
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("%d records left after trimming at the server's now", n)
	}
}
