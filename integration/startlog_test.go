package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
)

// TestStartLogNoNullError starts the delayd binary against a NATS URL where
// nothing listens, and checks its JSON log: the "not reachable yet" warning
// is there, and no line carries an "error" attribute without an error (a
// nil error logged as "error":null).
func TestStartLogNoNullError(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a free port: nothing listens there now
	p := b.StartProcess("DELAYD_NATS_URL=nats://"+addr, "DELAYD_LOG_LEVEL=info")
	itest.WaitFor(t, 60*time.Second, "the not-reachable warning", func() bool {
		return strings.Contains(p.Out.String(), "NATS not reachable yet")
	})
	for _, line := range strings.Split(p.Out.String(), "\n") {
		if strings.Contains(line, `"error":null`) {
			t.Errorf("log line with a nil error: %s", line)
		}
	}
}

// logRecords is a slog handler that keeps every record at or above its level, for tests to read.
type logRecords struct {
	level slog.Level
	mu    *sync.Mutex
	recs  *[]slog.Record
	attrs []slog.Attr
}

func newLogRecords(level slog.Level) logRecords {
	return logRecords{level: level, mu: &sync.Mutex{}, recs: &[]slog.Record{}}
}

func (h logRecords) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r)
	return nil
}
func (h logRecords) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(slices.Clone(h.attrs), as...)
	return h
}
func (h logRecords) WithGroup(string) slog.Handler { return h }

// find returns the records with message msg.
func (h logRecords) find(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range *h.recs {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

func attrOf(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestStartLogLeasesGained starts delayd with the default table and reads its log at info: one "leases gained"
// line names every lease it took (the router, the janitor, each level stream with its epoch), and no
// "lease gained" line per lease (those are at debug).
func TestStartLogLeasesGained(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	logs := newLogRecords(slog.LevelInfo)
	b.StartDelayd(levels.DefaultTable, func(c *deliver.Config) { c.Logger = slog.New(logs) })
	itest.WaitFor(t, 20*time.Second, "a leases gained line", func() bool { return len(logs.find("leases gained")) > 0 })
	tbl := levels.Default()
	want := []string{"router", "janitor", levels.StreamName(0)}
	for _, l := range append(tbl.Levels(), tbl.PrecisionLevels()...) {
		want = append(want, l.Stream())
	}
	sum := logs.find("leases gained")
	if len(sum) != 1 {
		t.Errorf("%d leases gained lines, want 1", len(sum))
	}
	leases := strings.Fields(attrOf(sum[0], "leases"))
	for _, w := range want {
		if !slices.ContainsFunc(leases, func(l string) bool { return strings.HasPrefix(l, w+"@") }) {
			t.Errorf("leases gained %q does not name %s", leases, w)
		}
	}
	if len(leases) != len(want) || attrOf(sum[0], "count") != fmt.Sprint(len(want)) {
		t.Errorf("leases gained: %d leases, count %s, want %d", len(leases), attrOf(sum[0], "count"), len(want))
	}
	if n := len(logs.find("lease gained")); n != 0 {
		t.Errorf("%d lease gained lines at info, want 0 (debug)", n)
	}
}
