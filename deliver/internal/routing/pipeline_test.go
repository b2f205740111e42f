package routing

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/natstest"
)

// recordingSink records what the acker reports, in order.
type recordingSink struct {
	mu     sync.Mutex
	events []string
}

func (s *recordingSink) add(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *recordingSink) writeConfirmed(rt *routing, _ *jetstream.PubAck) {
	s.add("ok " + strconv.FormatUint(rt.seq, 10))
}
func (s *recordingSink) writeRefused(rt *routing) { s.add("err " + strconv.FormatUint(rt.seq, 10)) }
func (s *recordingSink) tailSynced(stream string, seq uint64) {
	s.add("tail " + stream + " " + strconv.FormatUint(seq, 10))
}

// TestWritePipelineNeverWaitsOnAnOpenGroup: every write carries index
// records, with an acker queue of seven and groups of four. The acker
// packs the records of stored writes into groups and the confirmer waits
// for each group; neither may wait for the submitting side. All writes
// must be confirmed, in order, with the tail reports in their place, and
// their index records stored.
func TestWritePipelineNeverWaitsOnAnOpenGroup(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := index.EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{}
	p := newWritePipeline(js, slog.New(slog.DiscardHandler), sink, 8) // groups of up to 4 writes, a queue of 7
	acks, err := jswire.NewPubAcks(js.Conn(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	p.start()

	const n = 200
	done := make(chan struct{})
	var want []string
	go func() {
		defer close(done)
		for i := uint64(1); i <= n; i++ {
			if i%50 == 0 {
				p.reportTail("T", i)
				want = append(want, "tail T "+strconv.FormatUint(i, 10))
			}
			fut, err := acks.Publish(&nats.Msg{Subject: "t.x", Data: []byte("x")})
			if err != nil {
				panic(err)
			}
			rt := &routing{seq: i, fut: fut, nRecords: 1}
			rt.records[0] = index.Record{Key: index.SeqKey(i), Target: "x"}
			p.addRecords(rt, "T", i)
			p.sent(rt)
			want = append(want, "ok "+strconv.FormatUint(i, 10))
		}
		p.stop()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("the pipeline did not settle %d writes within a minute: the acker and the submitting side wait on each other", n)
	}
	sink.mu.Lock()
	got := slices.Clone(sink.events)
	sink.mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("acker reports\n got %v\nwant %v", got, want)
	}
	if e := p.indexErrors.Load(); e != 0 {
		t.Errorf("%d index groups failed", e)
	}
	info, err := js.Stream(ctx, index.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if info.CachedInfo().State.Msgs == 0 {
		t.Error("no index record stored")
	}
}

// lookupSink is a sink that, when a write is reported confirmed, looks up
// its id key in the index: its record must be stored by then.
type lookupSink struct {
	recordingSink
	reader *jswire.BatchReader
	miss   []string
}

func (s *lookupSink) writeConfirmed(rt *routing, ack *jetstream.PubAck) {
	s.recordingSink.writeConfirmed(rt, ack)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, ok, err := index.Lookup(ctx, s.reader, rt.records[0].Key, 5*time.Second)
	if err != nil || !ok || rec.Stream != "T" || rec.Seq != ack.Sequence {
		s.add("record missing " + strconv.FormatUint(rt.seq, 10))
	}
}

// TestWritePipelineRecordsOnlyStoredWrites: writes sent with
// Nats-Expected-Last-Sequence, every third one expecting a sequence the
// stream is not at (as a stale router's write after a newer router's epoch
// marker), so the server refuses it. A refused write leaves no index
// record, and a stored write's record is stored before the write is
// reported confirmed (its ingress message acked). With the records
// written alongside the write instead, a refused write's record is stored
// and is the latest for its key.
func TestWritePipelineRecordsOnlyStoredWrites(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := index.EnsureStreams(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	reader, err := jswire.NewBatchReader(nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	sink := &lookupSink{reader: reader}
	p := newWritePipeline(js, slog.New(slog.DiscardHandler), sink, 8)
	acks, err := jswire.NewPubAcks(nc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	p.start()
	const n = 30
	var want []string
	last := uint64(0) // the stream's last sequence
	for i := uint64(1); i <= n; i++ {
		refused := i%3 == 0
		expect := last
		if refused {
			expect = last + 100
		}
		m := &nats.Msg{Subject: "t.x", Data: []byte("x"), Header: nats.Header{jetstream.ExpectedLastSeqHeader: {strconv.FormatUint(expect, 10)}}}
		fut, err := acks.Publish(m)
		if err != nil {
			t.Fatal(err)
		}
		rt := &routing{seq: i, fut: fut, nRecords: 1}
		rt.records[0] = index.Record{Key: index.SeqKey(i), Target: "x"}
		p.addRecords(rt, "T", last+1) // the sequence the write is sent for
		p.sent(rt)
		if refused {
			want = append(want, "err "+strconv.FormatUint(i, 10))
			continue
		}
		last++
		want = append(want, "ok "+strconv.FormatUint(i, 10))
	}
	p.stop()
	if got := sink.events; !slices.Equal(got, want) {
		t.Errorf("acker reports\n got %v\nwant %v", got, want)
	}
	for i := uint64(3); i <= n; i += 3 {
		if rec, ok, err := index.Lookup(ctx, reader, index.SeqKey(i), 5*time.Second); err != nil || ok {
			t.Errorf("refused write %d: index record %+v (found %v, error %v); want none", i, rec, ok, err)
		}
	}
}
