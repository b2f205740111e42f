package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// logRecorder keeps delayd's JSON log lines (warn and above) for a test to
// search, and copies them to the test log.
type logRecorder struct{ buf *itest.SyncWriter }

func newLogRecorder(t *testing.T) (*logRecorder, func(*deliver.Config)) {
	r := &logRecorder{buf: &itest.SyncWriter{W: &bytes.Buffer{}}}
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(r.buf, itest.TWriter{T: t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
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
		remove func(t *testing.T, b *itest.Bundle)
		want   string // in the logged reason
	}{
		{"deleted", func(t *testing.T, b *itest.Bundle) {
			kv, err := b.JS.KeyValue(context.Background(), offsets.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			if err := kv.Delete(context.Background(), "DELAYD_100MS"); err != nil {
				t.Fatal(err)
			}
		}, "key deleted"},
		{"purged without a marker", func(t *testing.T, b *itest.Bundle) {
			s, err := b.JS.Stream(context.Background(), "KV_"+offsets.Bucket)
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
			b := itest.Setup(t)
			c := b.Collect("gone.>")
			b.StartDelayd("100ms 1s")
			const n = 20
			for i := range n {
				b.Publish("delay.gone.x", []byte("a"+strconv.Itoa(i)), itest.Level(1))
			}
			c.Wait(t, n, 10*time.Second)
			// The stream also holds the router's epoch marker, before the
			// messages: the last delivered ("a19") is at sequence last.
			var last uint64
			itest.WaitFor(t, 10*time.Second, "the last delivery's offset committed and the stream purged to it", func() bool {
				s, err := b.JS.Stream(context.Background(), "DELAYD_100MS")
				if err != nil {
					return false
				}
				info, err := s.Info(context.Background())
				last = info.State.LastSeq
				return err == nil && last >= n && info.State.FirstSeq == last
			})
			b.StopDelayd()
			tc.remove(t, b)

			logs, withLogs := newLogRecorder(t)
			b.StartDelayd("100ms 1s 2s", withLogs) // 2s: a new level stream
			b.Publish("delay.gone.x", []byte("b0"), itest.Level(1))
			itest.WaitFor(t, 10*time.Second, "b0 delivered", func() bool {
				for _, r := range c.Snapshot() {
					if string(r.Msg.Data) == "b0" {
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
					if from := fmt.Sprintf("delivering from sequence %d", last); !strings.Contains(reason, tc.want) || !strings.Contains(reason, from) {
						t.Errorf("reason %q: want %q and %q", reason, tc.want, from)
					}
					if rec["offset"] != float64(last-1) {
						t.Errorf("offset chosen %v, want %d", rec["offset"], last-1)
					}
				default:
					t.Errorf("unexpected correction of %v (a new or untouched level stream): %q", rec["stream"], reason)
				}
			}
			if !found {
				t.Errorf("no warning for DELAYD_100MS whose offset key was removed; logged:\n%s", logs.buf.String())
			}
			// Delivered again: exactly the stream's kept message (sequence last, "a19").
			seen := map[string]int{}
			for _, r := range c.Snapshot() {
				seen[string(r.Msg.Data)]++
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

// putHopKey stores value as the hop secret before delayd's first start.
func putHopKey(t *testing.T, b *itest.Bundle, value []byte) {
	t.Helper()
	ctx := context.Background()
	if _, err := offsets.New(ctx, b.JS, offsets.Config{}); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "hop-key", value); err != nil {
		t.Fatal(err)
	}
}

// TestHopKeyDamagedStopsDelayd sets the hop secret to values delayd never
// writes: delayd must refuse to run (before, it took them as a key of
// another length, and every derived delivery id changed), with an error
// naming the bucket and key and how to recover.
func TestHopKeyDamagedStopsDelayd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"garbage", []byte("garbage")},
		{"wrong length", bytes.Repeat([]byte{0xfe}, 31)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			putHopKey(t, b, tc.value)
			nc, err := nats.Connect(b.Srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			svc, err := deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("100ms"), Logger: itest.Logger(t), LeaseTTL: itest.LeaseTTL})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- svc.Run(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, deliver.ErrHopKey) {
					t.Fatalf("Run: %v; want ErrHopKey", err)
				}
				for _, want := range []string{"DELAYD_OFFSETS", `"hop-key"`, "nats kv del DELAYD_OFFSETS hop-key"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("delayd still running 20s after start on a hop secret it never wrote (%q); ready=%v", tc.value, svc.Ready())
			}
		})
	}
}

// TestHopKeyLegacyAccepted stores the hop secret as delayd stored it before
// its integrity check (32 raw random bytes) and checks that an upgraded
// delayd derives delivery ids with exactly that key: a stream-bound target
// still drops the re-delivery of a message delivered before the upgrade.
func TestHopKeyLegacyAccepted(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	legacy := make([]byte, 32)
	_, _ = rand.Read(legacy)
	legacy[0] = 0x80
	putHopKey(t, b, legacy)
	c := b.Collect("legacy.>")
	b.StartDelayd("100ms")
	b.Publish("delay.legacy.x", []byte("x"), itest.Level(1))
	got := c.Wait(t, 1, 10*time.Second)
	id := got[0].Msg.Header.Get("Nats-Msg-Id")
	i := len(id) - 13 // "-" and 12 characters of base64url MAC, which may hold "-" too
	if i < 0 || id[i] != '-' || !strings.HasPrefix(id, "delayd-") {
		t.Fatalf("delivered with Nats-Msg-Id %q, want delayd-<created>-<seq>-<mac>", id)
	}
	m := hmac.New(sha256.New, legacy)
	m.Write([]byte("delivery-id\x00" + id[:i]))
	if want := base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:9]); id[i+1:] != want {
		t.Errorf("Nats-Msg-Id %q: MAC %q, want %q (derived with the legacy key as stored)", id, id[i+1:], want)
	}
	kv, err := b.JS.KeyValue(context.Background(), offsets.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(context.Background(), "hop-key"); err != nil || !bytes.Equal(e.Value(), legacy) {
		t.Errorf("legacy hop-key changed or gone after start: %v", err)
	}
}

// TestHopKeyDamagedExit runs the delayd binary on a damaged hop secret: it
// must exit with status 1 and log why, naming the bucket and key.
func TestHopKeyDamagedExit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/delayd: skipped when testing.Short()")
	}
	t.Parallel()
	b := itest.Setup(t)
	putHopKey(t, b, []byte("garbage"))
	p := b.StartProcess("DELAYD_LEVELS=100ms")
	exited := make(chan error, 1)
	go func() { exited <- p.Cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("delayd exited with %v, want status 1", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("delayd still running 60s after start on a damaged hop secret; output:\n%s", p.Out.String())
	}
	out := p.Out.String()
	t.Logf("delayd's output:\n%s", out)
	for _, want := range []string{"hop secret in NATS is damaged", "DELAYD_OFFSETS", `\"hop-key\"`, "nats kv del DELAYD_OFFSETS hop-key"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not say %q", want)
		}
	}
}

// TestTailSyncForeignTail: after a crash, the router finds which ingress
// messages a level stream already holds from the Delayd-Ingress header of
// the stream's last message. Here an ingress message is already written to
// its level stream but not acked (as a crash between the two leaves it),
// and behind it the level stream holds a message that delayd did not write
// (published straight to the level subject), with no or a garbled ingress
// reference. The router must sync to its own last write and not write the
// ingress message a second time (it would be delivered twice), and say so.
func TestTailSyncForeignTail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ref  []string // the foreign message's Delayd-Ingress
	}{
		{"missing", nil},
		{"garbled", []string{"delayd-not-a-sequence"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			ctx := context.Background()
			logs, withLogs := newLogRecorder(t)
			c := b.Collect("tail.>")
			b.StartDelayd("100ms 1s")
			b.StopDelayd()
			ingress, err := b.JS.Stream(ctx, deliver.IngressStream)
			if err != nil {
				t.Fatal(err)
			}
			ingressID := strconv.FormatInt(ingress.CachedInfo().Created.UnixNano(), 10)

			// The crash's leftovers: the ingress message, and its level write.
			seq := b.Publish("delay.tail.m", []byte("m"), itest.Level(2))
			due := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
			if _, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: "delayd.level.1S.tail.m", Data: []byte("m"), Header: nats.Header{
				"Delayd-Ingress":    {"delayd-" + ingressID + "-" + strconv.FormatUint(seq, 10)},
				"Delay-Due-At":      {due},
				"Delay-Enqueued-At": {time.Now().UTC().Format(time.RFC3339Nano)},
			}}); err != nil {
				t.Fatal(err)
			}
			// Behind it, a message delayd did not write.
			h := nats.Header{"Delay-Due-At": {due}}
			if tc.ref != nil {
				h["Delayd-Ingress"] = tc.ref
			}
			if _, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: "delayd.level.1S.tail.foreign", Data: []byte("foreign"), Header: h}); err != nil {
				t.Fatal(err)
			}

			b.StartDelayd("100ms 1s", withLogs)
			itest.WaitFor(t, 15*time.Second, "m and the foreign message delivered, ingress empty", func() bool {
				return len(c.Snapshot()) >= 2 && b.StreamCount(deliver.IngressStream) == 0
			})
			b.StopDelayd() // settles what the router and scanners were doing
			n := 0
			for _, r := range c.Snapshot() {
				if string(r.Msg.Data) == "m" {
					n++
				}
			}
			if n != 1 {
				t.Errorf("m delivered %d times, want 1 (the router wrote it to DELAYD_1S again)", n)
			}
			if len(logs.records("level stream's last messages have no valid ingress reference (not written by delayd); synced to the last one that has")) == 0 {
				t.Errorf("no warning about DELAYD_1S's foreign tail; logged:\n%s", logs.buf.String())
			}
		})
	}
}

// TestGarbledTombstoneAndIndexRecord puts messages delayd cannot read on
// the id index slot of a pending message and among a level's cancel
// tombstones. A cancel must still find the message (a lookup skips what it
// cannot read), the valid tombstone must still hold after a restart, the
// unreadable one is logged and cancels nothing, and the other message is
// delivered.
func TestGarbledTombstoneAndIndexRecord(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	ctx := context.Background()
	c := b.Collect("garbled.>")
	b.StartDelayd("100ms 3s")
	for _, id := range []string{"a", "b"} {
		h := itest.Level(2)
		h.Set("Nats-Msg-Id", id)
		b.Publish("delay.garbled."+id, []byte(id), h)
	}
	// Behind a's index record, on its slot: a record that is not one.
	slot := fnv.New64a()
	slot.Write([]byte("ua")) // the index key of publisher id "a"
	if _, err := b.JS.Publish(ctx, "delayd.idx."+strconv.FormatUint(slot.Sum64()%deliver.IndexSlots, 10), []byte("garbage 1 - x 99\nua")); err != nil {
		t.Fatal(err)
	}
	if r := b.Cancel("a"); r != "cancelled" {
		t.Fatalf("cancel a behind a garbled index record: %q, want cancelled", r)
	}
	b.StopDelayd()
	if _, err := b.JS.Publish(ctx, "delayd.cancels.DELAYD_3S", []byte("not a tombstone")); err != nil {
		t.Fatal(err)
	}
	logs, withLogs := newLogRecorder(t)
	b.StartDelayd("100ms 3s", withLogs)
	got := c.Wait(t, 1, 15*time.Second)
	if string(got[0].Msg.Data) != "b" {
		t.Errorf("delivered %q, want b", got[0].Msg.Data)
	}
	itest.WaitFor(t, 15*time.Second, "DELAYD_3S passes a's sequence", func() bool {
		_, ss := b.Svc.Stats()
		for _, s := range ss {
			if s.Stream == "DELAYD_3S" {
				return s.Offset >= 2
			}
		}
		return false
	})
	for _, r := range c.Snapshot() {
		if string(r.Msg.Data) == "a" {
			t.Errorf("cancelled message a delivered")
		}
	}
	if len(logs.records("cancel tombstone not readable; ignored")) != 1 {
		t.Errorf("want one warning for the unreadable tombstone; logged:\n%s", logs.buf.String())
	}
}
