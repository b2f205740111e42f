package index

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	if err := Trim(ctx, js, times[3], 10*time.Millisecond, nil); err != nil {
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
	if err := Trim(ctx, js, time.Time{}, 0, nil); err != nil {
		t.Fatal(err)
	}
	info, _ := js.Stream(ctx, Stream)
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("%d records left after trimming at the server's now", n)
	}
}

// sameSlot returns n keys other than key on key's slot subject.
func sameSlot(key string, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if k := UserKey(fmt.Sprint("other-", i)); Subject(k) == Subject(key) {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestLookup reads the latest record of a key from a real server: the
// last of its records in the newest message holding one, with At that
// message's sequence; other keys on the same slot, and a message that
// does not decode, do not hide it; a key with no record is not found; a
// slot longer than one read (Batch messages) is read to its end; without
// the stream the error says so.
func TestLookup(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx := context.Background()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	a := UserKey("a")
	others := sameSlot(a, 3)
	b, c, d := others[0], others[1], others[2]
	publish := func(data []byte) uint64 {
		t.Helper()
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: Subject(a), Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	lookup := func(key string, want Record, wantOK bool) {
		t.Helper()
		got, ok, err := Lookup(ctx, reader, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ok != wantOK || !sameRecord(got, want) {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, %v", key, got, ok, want, wantOK)
		}
	}

	first := Record{Key: a, Stream: "DELAYD_1S", Seq: 1, Due: time.Unix(0, 1)}
	later := Record{Key: a, Stream: "DELAYD_5S", Seq: 3, Hop: true, Due: time.Unix(0, 3), Target: "orders.close"}
	placedB := Record{Key: b, Stream: "DELAYD_1S", Seq: 2, Due: time.Unix(0, 2)}
	at1 := publish(later.AppendTo(placedB.AppendTo(first.AppendTo(nil))))
	publish([]byte("garbage that does not decode\n"))
	goneB := Record{Key: b, Gone: true, Due: time.Unix(0, 0), Target: "orders.close"}
	at3 := publish(goneB.AppendTo(nil))

	later.At, goneB.At = at1, at3
	lookup(a, later, true)
	lookup(b, goneB, true)
	lookup(c, Record{}, false)

	// A newer message wins, though malformed bytes follow its record.
	newest := Record{Key: a, Stream: "DELAYD_2H", Seq: 4, Due: time.Unix(0, 4)}
	newest.At = publish(append(newest.AppendTo(nil), "trailing garbage"...))
	lookup(a, newest, true)

	// More messages on the slot than one read returns.
	var last Record
	for i := range Batch + 50 {
		last = Record{Key: d, Stream: "DELAYD_1S", Seq: uint64(100 + i), Due: time.Unix(0, int64(i))}
		last.At = publish(last.AppendTo(nil))
	}
	lookup(d, last, true)
	lookup(a, newest, true)

	if err := js.DeleteStream(ctx, Stream); err != nil {
		t.Fatal(err)
	}
	_, ok, err := Lookup(ctx, reader, a, 10*time.Second)
	if !errors.Is(err, nats.ErrNoResponders) || !strings.HasPrefix(err.Error(), "index lookup: ") || ok {
		t.Errorf("Lookup without the stream = %v, %v; want an index lookup error wrapping nats.ErrNoResponders", ok, err)
	}
}

// TestGroup packs records into one message per slot, writes them only at
// Flush, and Stored reports them stored: Stored called before Flush waits
// for it, and every record is then found by Lookup (the later of two
// records for one key winning).
func TestGroup(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx := context.Background()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	g := NewGroup()
	var recs []Record
	slots := map[string]bool{}
	for i := range 50 {
		rec := Record{Key: SeqKey(uint64(i)), Stream: "DELAYD_1S", Seq: uint64(i + 1), Due: time.Unix(0, int64(i)), Target: "orders.close"}
		g.Add(rec)
		recs = append(recs, rec)
		slots[Subject(rec.Key)] = true
	}
	recs[7] = Record{Key: recs[7].Key, Stream: "DELAYD_5S", Seq: 99, Hop: true, Due: time.Unix(0, 99)}
	g.Add(recs[7])

	stored := make(chan error, 1)
	go func() { stored <- g.Stored() }()
	// Nothing can be stored yet; Stored must still be waiting. (A window,
	// not a speed: it can only miss a Stored that returns early.)
	select {
	case err := <-stored:
		t.Fatalf("Stored returned %v before Flush", err)
	case <-time.After(200 * time.Millisecond):
	}
	if n := streamMsgs(t, js); n != 0 {
		t.Fatalf("%d index messages before Flush", n)
	}
	g.Flush(js)
	select {
	case err := <-stored:
		if err != nil {
			t.Fatalf("Stored: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stored did not return after Flush")
	}
	if err := g.Stored(); err != nil {
		t.Errorf("Stored again: %v", err)
	}
	if n := streamMsgs(t, js); n != uint64(len(slots)) {
		t.Errorf("%d index messages for %d slots, want one per slot", n, len(slots))
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for _, want := range recs {
		got, ok, err := Lookup(ctx, reader, want.Key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		want.At = got.At
		if !ok || got.At == 0 || !sameRecord(got, want) {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v", want.Key, got, ok, want)
		}
	}
}

// TestGroupStoredFailure: a group whose writes fail (no index stream)
// reports the failure from Stored, to every caller.
func TestGroupStoredFailure(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	g := NewGroup()
	g.Add(Record{Key: UserKey("x"), Stream: "DELAYD_1S", Seq: 1})
	g.Flush(js)
	err := g.Stored()
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("Stored = %v, want %v", err, jetstream.ErrNoStreamResponse)
	}
	if again := g.Stored(); again != err {
		t.Errorf("Stored again = %v, want %v", again, err)
	}
}

// TestEnsureStreams creates both streams as docs/operations.md#jetstream-resources
// lists them, idempotently, and records and tombstones land in them.
func TestEnsureStreams(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx := context.Background()
	if !ServerNow(ctx, js).IsZero() {
		t.Error("ServerNow without the index stream is not zero")
	}
	for range 2 {
		if err := EnsureStreams(ctx, js, 1); err != nil {
			t.Fatal(err)
		}
	}
	for name, subject := range map[string]string{Stream: "delayd.idx.>", CancelStream: "delayd.cancels.>"} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		if !slices.Equal(cfg.Subjects, []string{subject}) || !cfg.AllowDirect || cfg.Retention != jetstream.LimitsPolicy ||
			cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 || cfg.Duplicates != 100*time.Millisecond {
			t.Errorf("stream %s: %+v", name, cfg)
		}
	}
	if _, err := js.PublishMsg(ctx, Record{Key: UserKey("x")}.Msg()); err != nil {
		t.Errorf("record not stored: %v", err)
	}
	if _, err := js.Publish(ctx, TombstoneSubject("DELAYD_5S"), Tombstone{Seq: 1, Key: "ux"}.Encode()); err != nil {
		t.Errorf("tombstone not stored: %v", err)
	}
	if ServerNow(ctx, js).IsZero() {
		t.Error("ServerNow with the index stream is zero")
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), Stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestLookupLatest finds a key's latest record past records of other keys
// on its slot, and returns at once, with nothing, for a key whose slot
// holds no record (the leader has no last message to wait for).
func TestLookupLatest(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	key := UserKey("x")
	var gone uint64
	for i, rec := range []Record{
		{Key: key, Stream: "DELAYD_5S", Seq: 2, Target: "tgt"},
		{Key: key, Gone: true, Target: "tgt"},
		{Key: sameSlot(key, 1)[0], Stream: "DELAYD_5S", Seq: 3},
	} {
		ack, err := js.PublishMsg(ctx, rec.Msg())
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			gone = ack.Sequence
		}
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rec, ok, err := LookupLatest(ctx, nc, reader, key, 10*time.Second, nil)
	if err != nil || !ok || !rec.Gone || rec.At != gone {
		t.Errorf("LookupLatest(%q) = %+v, %v, %v; want the cancelled record at %d", key, rec, ok, err, gone)
	}
	var empty string
	for i := 0; empty == ""; i++ {
		if k := UserKey(fmt.Sprint("none-", i)); Subject(k) != Subject(key) {
			empty = k
		}
	}
	if rec, ok, err := LookupLatest(ctx, nc, reader, empty, 10*time.Second, nil); err != nil || ok {
		t.Errorf("LookupLatest(%q) on an empty slot = %+v, %v, %v; want nothing", empty, rec, ok, err)
	}
}

// TestTrimEmptyIndex: a trim of an index that never held a record asks
// its before hook (the kept answers' pass) for nothing below sequence 1:
// the hook reads from the first sequence it is given, and a direct get
// from sequence 0 is refused ("408 Empty Request"), which an idle delayd
// logged as a failed trim every 10 s.
func TestTrimEmptyIndex(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx := context.Background()
	if err := EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	reader, err := jswire.NewBatchReader(nc, Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	before := func(ctx context.Context, first, end uint64) (uint64, error) {
		if _, err := reader.Read(ctx, Stream, nil, first, 1, 1<<20); err != nil {
			return first, fmt.Errorf("read from %d: %w", first, err)
		}
		return end, nil
	}
	for _, cutoff := range []time.Time{{}, time.Now().Add(time.Hour)} {
		if err := Trim(ctx, js, cutoff, 0, before); err != nil {
			t.Errorf("trim of an empty index (cutoff %v): %v", cutoff, err)
		}
	}
}
