package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// BenchmarkAnswers measures what a kept answer costs (docs/guarantees.md#what-kept-answers-cost):
// it writes n answers to DELAYD_ANSWERS as the janitor does (ids like
// "order-123456", target "orders.close"), then reports the stream's bytes
// on disk per answer (disk-B/answer) and the growth of this process's
// live heap per answer after a GC (heap-B/answer: the server, in this
// process, keeps a per-subject entry for every answer; the client's share
// is garbage by then), and times one lookup (ns/op: a direct get of the
// id's subject, server and client, with the server in this process).
//
//	go test -run '^$' -bench BenchmarkAnswers -benchtime 200x ./deliver/internal/index
func BenchmarkAnswers(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("answers=%d", n), func(b *testing.B) { benchmarkAnswers(b, n) })
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func benchmarkAnswers(b *testing.B, n int) {
	nc, js := natstest.Connect(b)
	ctx := context.Background()
	if err := EnsureAnswerStream(ctx, js, AnswerConfig{Keep: time.Hour, MaxBytes: 8 << 30, Replicas: 1}); err != nil {
		b.Fatal(err)
	}
	before := liveHeap()
	due := time.Now()
	var acks []jetstream.PubAckFuture
	for i := range n {
		ack, err := js.PublishMsgAsync(Answer{Key: UserKey(fmt.Sprintf("order-%d", i)), Target: "orders.close", Due: due, Cancelled: i%2 == 0}.Msg())
		if err != nil {
			b.Fatal(err)
		}
		acks = append(acks, ack)
		if len(acks) == 1024 || i == n-1 {
			for _, a := range acks {
				select {
				case <-a.Ok():
				case err := <-a.Err():
					b.Fatal(err)
				}
			}
			acks = acks[:0]
		}
	}
	acks = nil
	st, err := js.Stream(ctx, AnswerStream)
	if err != nil {
		b.Fatal(err)
	}
	info := st.CachedInfo()
	if info.State.Msgs != uint64(n) {
		b.Fatalf("%d answers stored, want %d", info.State.Msgs, n)
	}
	after := liveHeap()
	for b.Loop() {
		i := rand.IntN(n)
		a, ok, err := LookupAnswer(ctx, nc, UserKey(fmt.Sprintf("order-%d", i)))
		if err != nil || !ok || a.Cancelled != (i%2 == 0) {
			b.Fatalf("lookup order-%d: %+v %v %v", i, a, ok, err)
		}
	}
	b.ReportMetric(float64(info.State.Bytes)/float64(n), "disk-B/answer")
	b.ReportMetric((float64(after)-float64(before))/float64(n), "heap-B/answer")
}
