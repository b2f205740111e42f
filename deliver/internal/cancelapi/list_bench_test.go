package cancelapi

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// The list benchmark's stream: benchOthers messages of benchTargets other
// targets, with two targets of benchMine messages each: "bench.together"
// stored one after another in the middle of the stream, "bench.spread"
// one every benchOthers/benchMine others.
const (
	benchOthers  = 1_000_000
	benchTargets = 1000
	benchMine    = 100
)

// benchDecider is the walk's owner in the benchmark: nothing passed or
// cancelled, one level stream. (It stands for the level owner, not for
// NATS: the reads are a real server's.)
type benchDecider struct{ stream string }

func (d benchDecider) Decide(context.Context, *jswire.BatchReader, index.Record, level.Ask) (level.CancelAnswer, error) {
	return level.AnswerGone, nil
}

func (d benchDecider) Sift(context.Context, string, []uint64) (level.Sifted, error) {
	return level.Sifted{}, nil
}

func (d benchDecider) Streams() []string { return []string{d.stream} }

// BenchmarkListPage measures one first page (limit 100: the items, total
// and next_due) of a target with 100 pending messages in a level stream of
// 1M other targets' messages (docs/pending.md#12-how-one-stream-is-read-and-what-it-costs):
// stored together, spread through the stream, and a target with none. It
// reports the direct-get requests the page sent (reads/op) besides ns/op,
// and, as NAME-reads, the time of the same reads alone.
// The stream is written once per run, by async publishes of level
// messages as the router writes them (subject and headers), which takes a
// while on a loaded machine (b.Log says how long).
//
//	go test -run '^$' -bench BenchmarkListPage -benchtime 5x ./deliver/internal/cancelapi
func BenchmarkListPage(b *testing.B) {
	nc, js := natstest.Connect(b)
	ctx := context.Background()
	stream := levels.StreamName(time.Hour)
	levelPrefix := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + "."
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{levelPrefix + ">"}, AllowDirect: true}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	loadBenchStream(b, js, levelPrefix)
	b.Logf("stream %s: %d messages written in %s", stream, benchOthers+2*benchMine, time.Since(start).Round(time.Millisecond))

	// The direct gets the walk sends, counted on the server's side of the
	// wire by a subscriber of their subject.
	var reads atomic.Int64
	cnc, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		b.Fatal(err)
	}
	defer cnc.Close()
	if _, err := cnc.Subscribe("$JS.API.DIRECT.GET."+stream, func(*nats.Msg) { reads.Add(1) }); err != nil {
		b.Fatal(err)
	}
	if err := cnc.Flush(); err != nil {
		b.Fatal(err)
	}
	a := New(Config{
		Conn: nc, JS: js, LookupShare: 1, Decider: benchDecider{stream}, Levels: levels.MustParse("1s 1h"),
		Logger: slog.New(slog.DiscardHandler), RouterWaiting: func() int { return 0 },
	})
	wk := &worker{a.env} // the page is a list worker's work
	reader, err := jswire.NewBatchReader(nc, listBatch)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	for _, c := range []struct {
		name, target string
		want         int
	}{{"together", "bench.together", benchMine}, {"spread", "bench.spread", benchMine}, {"none", "bench.none", 0}} {
		b.Run(c.name, func(b *testing.B) {
			q := listQuery{target: c.target, limit: contract.PendingLimitDefault, first: true}
			// nc's flush: the server has routed its requests to cnc; cnc's:
			// cnc has counted them.
			_, _ = nc.Flush(), cnc.Flush()
			before := reads.Load()
			b.ResetTimer()
			for range b.N {
				// The walk without its routed wait (no router here).
				k := &walker{q: q, walks: make(map[string]*streamWalk), gone: make(map[string]map[uint64]bool)}
				w := wk.streamWalk(stream)
				k.walks[stream] = w
				if err := wk.walkStream(ctx, reader, k, w, time.Now().Add(time.Minute)); err != nil {
					b.Fatal(err)
				}
				reply, _, err := wk.page(ctx, k)
				if err != nil {
					b.Fatal(err)
				}
				if len(reply.Items) != c.want || reply.Total == nil || *reply.Total != c.want {
					b.Fatalf("%s: %d items, total %v; want %d", c.target, len(reply.Items), reply.Total, c.want)
				}
			}
			b.StopTimer()
			_, _ = nc.Flush(), cnc.Flush()
			b.ReportMetric(float64(reads.Load()-before)/float64(b.N), "reads/op")
		})
		// The same reads without the walk and its pacer, right after the
		// page's: the server's cost of the page's reads with the blocks
		// they span in its cache. (Swapped, each costs what the other did:
		// a spread page's first run after another target's reads loads the
		// blocks, about 0.6 s at 1M on a loaded 2-core machine; once they
		// are cached, about 70–85 ms.)
		b.Run(c.name+"-reads", func(b *testing.B) {
			subject := levelPrefix + c.target
			var buf []*nats.Msg
			for range b.N {
				got := 0
				for from, n := uint64(1), 1; ; n = listBatch {
					if buf, err = reader.ReadSubject(ctx, stream, subject, buf[:0], from, n, 1<<20); err != nil {
						b.Fatal(err)
					}
					if len(buf) == 0 {
						break
					}
					if n > 1 {
						got += len(buf)
					}
					seq, _ := strconv.ParseUint(buf[len(buf)-1].Header.Get(jswire.HeaderSequence), 10, 64)
					from = seq + 1
					if n == 1 {
						from = 1 // the walk's probe, then its reads from past passed (0 here)
					}
				}
				if got != c.want {
					b.Fatalf("%s: read %d, want %d", c.target, got, c.want)
				}
			}
		})
	}
}

// loadBenchStream writes the benchmark's stream: level messages of a 1h
// level, each with the router's headers and a 200-byte payload.
func loadBenchStream(b *testing.B, js jetstream.JetStream, levelPrefix string) {
	payload := []byte(strings.Repeat("x", 200))
	stored := time.Now()
	seq := uint64(0)
	publish := func(target string) {
		seq++
		enq := stored.Add(time.Duration(seq) * time.Microsecond)
		h := nats.Header{
			contract.HeaderEnqueuedAt: {contract.FormatTime(enq)},
			contract.HeaderDueAt:      {contract.FormatTime(enq.Add(time.Hour))},
			message.HdrIngress:        {"delayd-bench-" + strconv.FormatUint(seq, 10)},
			message.HdrMsgID:          {"m-" + strconv.FormatUint(seq, 10)},
			"X-Trace":                 {"t"},
		}
		for {
			_, err := js.PublishMsgAsync(&nats.Msg{Subject: levelPrefix + target, Header: h, Data: payload})
			if err == nil {
				return
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Second):
			}
		}
	}
	every := benchOthers / benchMine
	for i := range benchOthers {
		if i%every == every/2 {
			publish("bench.spread")
		}
		if i == benchOthers/2 {
			for range benchMine {
				publish("bench.together")
			}
		}
		publish(fmt.Sprintf("bench.other.%d", i%benchTargets))
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("async publishes not acked within 5 minutes")
	}
}
