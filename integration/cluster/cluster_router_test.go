//go:build long && unix

package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestClusterRouterPaused stops (SIGSTOP) the replica holding the router
// lease while the load publishes, waits until the other replica routes,
// and continues the stopped one (docs/guarantees.md#epoch-markers: the router's
// epoch markers), three times, so each replica is the stale one at least
// once. The stopped router may have had writes in flight, or in nats.go's
// buffer, when it stopped; once continued it must neither lose nor double a
// message. Every level stream (read through an audit stream that sources
// them, since the scanners purge what they delivered) holds its messages,
// markers excluded, in strictly increasing ingress order, and each message
// of the load in its own level's stream exactly once; nothing is lost,
// early or duplicated at the stream target, and the core target sees no
// more than a window per level again. (A stop at a random instant rarely
// lands between the router's lease check and its level write, so this
// test passes without the markers too: TestRouterPausedInMergeCheck
// stops the router there.)
func TestClusterRouterPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3)
	r0 := startReplica(t, "r0", c.URLs())
	r0.waitReady(time.Minute)
	r1 := startReplica(t, "r1", c.URLs())
	r1.waitReady(time.Minute)
	nc, js := c.Connect(0)
	audit := newLevelAudit(t, js, clusterLevels)
	load := loadConfig{Total: 9000, Rate: 1000, Levels: clusterLevels}
	l := newLoad(t, nc, js, load)
	l.start()

	const pauses = 3
	for p := 1; p <= pauses; p++ {
		l.waitAcked(p*load.Total/(pauses+1), time.Minute)
		var stale *replica
		itest.WaitFor(t, time.Minute, "a replica holding the router lease", func() bool {
			for _, r := range []*replica{r0, r1} {
				if metricValue(t, r, `delayd_lease_held{lease="router"}`) == 1 {
					stale = r
				}
			}
			return stale != nil
		})
		next := r1
		if stale == r1 {
			next = r0
		}
		routedBefore := metricValue(t, next, "delayd_routed_total")
		paused := time.Now()
		stale.pause()
		t.Logf("pause %d: stopped %s, the router lease's holder, at %s", p, stale.name, paused.Format("15:04:05.000"))
		itest.WaitFor(t, time.Minute, next.name+" to take the router lease and route", func() bool {
			return metricValue(t, next, `delayd_lease_held{lease="router"}`) == 1 && metricValue(t, next, "delayd_routed_total") > routedBefore
		})
		t.Logf("pause %d: %s routes %s after the stop; continuing %s", p, next.name, time.Since(paused).Round(time.Millisecond), stale.name)
		stale.resume()
		itest.WaitFor(t, time.Minute, stale.name+" to give up the router lease", func() bool {
			return metricValue(t, stale, `delayd_lease_held{lease="router"}`) == 0
		})
	}

	l.waitPublished(3 * time.Minute)
	l.waitDelivered(time.Minute)
	rep := l.report()
	for _, r := range []*replica{r0, r1} {
		for _, e := range r.log.events() {
			if strings.HasPrefix(e.msg, "router stopped") || strings.HasPrefix(e.msg, "router restarting") {
				t.Logf("%s: %q (epoch %s, error %s)", r.name, e.msg, e.attr("epoch"), e.attr("error"))
			}
		}
	}
	t.Logf("%d pauses of the router lease's holder:\n%s", pauses, rep)
	rep.checkLevels(t)
	rep.checkStream(t)
	rep.checkCore(t, pauses, deliver.ScannerWindowDefault, clusterLevels)
	audit.check(l)
}

// metricValue returns the value of the sample named series (name and
// labels exactly as /metrics prints them) on r's /metrics; -1 if r does not
// answer or has no such sample.
func metricValue(t *testing.T, r *replica, series string) float64 {
	t.Helper()
	code, body, err := r.get("/metrics")
	if err != nil || code != 200 {
		return -1
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// levelAudit is a stream that sources every level stream of a table, so
// that what the routers wrote can be read after the scanners purged it.
// Sourcing copies each stored message once, in its stream's order, with
// its origin stream and sequence in the Nats-Stream-Source header.
type levelAudit struct {
	t      *testing.T
	js     jetstream.JetStream
	table  levels.Table
	stream string
}

// newLevelAudit creates the audit stream (R3, file storage) sourcing each
// level stream of table from its first message, and waits until each
// source's consumer is set up (the server then reports it active). Create
// it before the load: the scanners purge delivered messages, and a message
// purged before it was sourced is missing from the audit (check reports
// that).
func newLevelAudit(t *testing.T, js jetstream.JetStream, table levels.Table) *levelAudit {
	t.Helper()
	a := &levelAudit{t: t, js: js, table: table, stream: "LEVELAUDIT"}
	var sources []*jetstream.StreamSource
	for _, lvl := range table.Levels() {
		sources = append(sources, &jetstream.StreamSource{Name: lvl.Stream()})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: a.stream, Sources: sources, Storage: jetstream.FileStorage, Replicas: 3})
	if err != nil {
		t.Fatalf("create audit stream: %v", err)
	}
	itest.WaitFor(t, time.Minute, "the audit stream's sources set up", func() bool {
		info, err := s.Info(ctx)
		if err != nil || len(info.Sources) != len(sources) {
			return false
		}
		for _, si := range info.Sources {
			if si.Active < 0 {
				return false
			}
		}
		return true
	})
	return a
}

// check waits until the audit holds every level stream's last message,
// then fails the test unless, for each level stream: the audit holds every
// sequence the load's writes took (none purged before it was sourced),
// its messages other than epoch markers carry strictly increasing ingress
// sequences (Delayd-Ingress), and each message of l is in its own level's
// stream exactly once.
func (a *levelAudit) check(l *load) {
	t := a.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := map[string]uint64{}
	for _, lvl := range a.table.Levels() {
		s, err := a.js.Stream(ctx, lvl.Stream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last[lvl.Stream()] = info.State.LastSeq
	}
	type origin struct {
		stream string
		seq    uint64
	}
	parse := func(m *jetstream.RawStreamMsg) origin {
		f := strings.Fields(m.Header.Get("Nats-Stream-Source"))
		if len(f) < 2 {
			return origin{}
		}
		seq, _ := strconv.ParseUint(f[1], 10, 64)
		return origin{f[0], seq}
	}
	var msgs []*jetstream.RawStreamMsg
	itest.WaitFor(t, time.Minute, "the audit stream to source every level write", func() bool {
		msgs = (&itest.Bundle{T: t, JS: a.js}).StreamMsgs(a.stream)
		seen := map[string]uint64{}
		for _, m := range msgs {
			o := parse(m)
			seen[o.stream] = max(seen[o.stream], o.seq)
		}
		for s, n := range last {
			if seen[s] < n {
				return false
			}
		}
		return true
	})
	seqs := map[string]map[uint64]bool{}
	lastIngress := map[string]uint64{}
	where := map[int][]string{}
	markers := map[string][]string{} // by level stream: "epoch@sequence"
	for _, m := range msgs {
		o := parse(m)
		if seqs[o.stream] == nil {
			seqs[o.stream] = map[uint64]bool{}
		}
		seqs[o.stream][o.seq] = true
		if itest.MatchMarker(m.Subject) {
			markers[o.stream] = append(markers[o.stream], m.Header.Get("Delayd-Router-Epoch")+"@"+strconv.FormatUint(o.seq, 10))
			continue
		}
		ref := m.Header.Get("Delayd-Ingress")
		i := strings.LastIndexByte(ref, '-')
		ing, err := strconv.ParseUint(ref[i+1:], 10, 64)
		if i < 0 || err != nil {
			t.Errorf("%s sequence %d: no valid Delayd-Ingress (%q)", o.stream, o.seq, ref)
			continue
		}
		if ing <= lastIngress[o.stream] {
			t.Errorf("%s sequence %d: ingress sequence %d after %d: not strictly increasing", o.stream, o.seq, ing, lastIngress[o.stream])
		}
		lastIngress[o.stream] = ing
		n, err := strconv.Atoi(string(m.Data))
		if err != nil {
			t.Errorf("%s sequence %d: payload %q is not the load's", o.stream, o.seq, m.Data)
			continue
		}
		where[n] = append(where[n], o.stream)
	}
	for s, n := range last {
		from := l.base[s] + 1
		var missing []uint64
		for seq := from; seq <= n; seq++ {
			if !seqs[s][seq] {
				missing = append(missing, seq)
			}
		}
		if len(missing) > 0 {
			t.Errorf("audit of %s misses %d of sequences %d..%d (purged before they were sourced), e.g. %v: the level checks below are incomplete",
				s, len(missing), from, n, missing[:min(len(missing), 10)])
		}
	}
	var bad []string
	for i := range l.cfg.Total {
		lvl, _ := l.cfg.Levels.Level(i%l.cfg.Levels.Len() + 1)
		if got := where[i]; len(got) != 1 || got[0] != lvl.Stream() {
			bad = append(bad, fmt.Sprintf("%d in %v", i, got))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d messages of the load not in their level stream exactly once (want each in its level's stream once), e.g. %v", len(bad), bad[:min(len(bad), 10)])
	}
	t.Logf("audit: %d level-stream messages sourced; epoch markers (epoch@sequence): %v", len(msgs), markers)
}
