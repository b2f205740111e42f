package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/offsets"
)

// logRecorder keeps delayd's JSON log lines (warn and above) for a test to
// search, and copies them to the test log.
type logRecorder struct{ buf *syncWriter }

func newLogRecorder(t *testing.T) (*logRecorder, func(*deliver.Config)) {
	r := &logRecorder{buf: &syncWriter{w: &bytes.Buffer{}}}
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(r.buf, tWriter{t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return r, func(c *deliver.Config) { c.Logger = logger }
}

// records returns the logged records whose msg is msg.
func (r *logRecorder) records(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.buf.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestOffsetKeyGoneIsLogged deletes a level stream's offset key (or purges
// it from the bucket's stream, leaving no delete marker) while delayd is
// stopped. At the next start the scanner must log the correction as a
// warning that names the stream, what it found and from which sequence it
// delivers again, and deliver again exactly the messages the level stream
// still held (the kept last delivered one), nothing else. A level stream
// that is new (added to the table, never delivered) has no offset either:
// no warning for it.
func TestOffsetKeyGoneIsLogged(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		remove func(t *testing.T, b *testBundle)
		want   string // in the logged reason
	}{
		{"deleted", func(t *testing.T, b *testBundle) {
			kv, err := b.js.KeyValue(context.Background(), offsets.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			if err := kv.Delete(context.Background(), "DELAYD_100MS"); err != nil {
				t.Fatal(err)
			}
		}, "key deleted"},
		{"purged without a marker", func(t *testing.T, b *testBundle) {
			s, err := b.js.Stream(context.Background(), "KV_"+offsets.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Purge(context.Background(), jetstream.WithPurgeSubject("$KV."+offsets.Bucket+".DELAYD_100MS")); err != nil {
				t.Fatal(err)
			}
		}, "no offset stored, but the stream was purged up to sequence"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.collect("gone.>")
			b.startDelayd("100ms 1s")
			const n = 20
			for i := range n {
				b.publish("delay.gone.x", []byte("a"+strconv.Itoa(i)), level(1))
			}
			c.wait(t, n, 10*time.Second)
			waitFor(t, 10*time.Second, "offset 20 committed and the stream purged to it", func() bool {
				s, err := b.js.Stream(context.Background(), "DELAYD_100MS")
				if err != nil {
					return false
				}
				info, err := s.Info(context.Background())
				return err == nil && info.State.FirstSeq == n
			})
			b.stopDelayd()
			tc.remove(t, b)

			logs, withLogs := newLogRecorder(t)
			b.startDelayd("100ms 1s 2s", withLogs) // 2s: a new level stream
			b.publish("delay.gone.x", []byte("b0"), level(1))
			waitFor(t, 10*time.Second, "b0 delivered", func() bool {
				for _, r := range c.snapshot() {
					if string(r.msg.Data) == "b0" {
						return true
					}
				}
				return false
			})

			var found bool
			for _, rec := range logs.records("offset corrected") {
				reason, _ := rec["reason"].(string)
				switch rec["stream"] {
				case "DELAYD_100MS":
					found = true
					if !strings.Contains(reason, tc.want) || !strings.Contains(reason, "delivering from sequence 20") {
						t.Errorf("reason %q: want %q and the sequence delivered from (20)", reason, tc.want)
					}
					if rec["offset"] != float64(n-1) {
						t.Errorf("offset chosen %v, want %d", rec["offset"], n-1)
					}
				default:
					t.Errorf("unexpected correction of %v (a new or untouched level stream): %q", rec["stream"], reason)
				}
			}
			if !found {
				t.Errorf("no warning for DELAYD_100MS whose offset key was removed; logged:\n%s", logs.buf.String())
			}
			// Delivered again: exactly the stream's kept message (sequence 20, "a19").
			seen := map[string]int{}
			for _, r := range c.snapshot() {
				seen[string(r.msg.Data)]++
			}
			for i := range n {
				want := 1
				if i == n-1 {
					want = 2
				}
				if got := seen["a"+strconv.Itoa(i)]; got != want {
					t.Errorf("a%d delivered %d times, want %d", i, got, want)
				}
			}
		})
	}
}
