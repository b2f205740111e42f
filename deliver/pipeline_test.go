package deliver

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
// records, and the submitting side never flushes on its own (no idle
// ingress, no retry), with an acker queue of one. The acker waits for
// each write's index group to be stored; the pipeline must hand it a write
// only after that group's writes are started, or the two sides wait on
// each other for ever. All writes must be confirmed, in order, with the
// tail reports in their place, and their index records stored.
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
	p := newWritePipeline(js, slog.New(slog.DiscardHandler), sink, 8) // up to 4 writes held for their group, a queue of 4
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
			fut, err := js.PublishMsgAsync(&nats.Msg{Subject: "t.x", Data: []byte("x")})
			if err != nil {
				panic(err)
			}
			rt := &routing{seq: i, fut: fut, nIndex: 1}
			rt.index[0] = index.Record{Key: index.SeqKey(i), Target: "x"}
			p.addIndex(rt, "T", i)
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
	info, err := js.Stream(ctx, IndexStream)
	if err != nil {
		t.Fatal(err)
	}
	if info.CachedInfo().State.Msgs == 0 {
		t.Error("no index record stored")
	}
}
