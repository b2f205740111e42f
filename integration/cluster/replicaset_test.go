//go:build unix

package cluster

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
)

// Helpers for tests with several delayd replicas (cluster_replicas_test.go):
// who holds which lease, read from each replica's /metrics, and what each
// level's deliveries looked like around a fault.

// startReplicas starts n replicas "r0".."r<n-1>" against natsURL with env
// (see startReplica): r0 first, alone, until it is ready (so it creates
// the streams and buckets and takes every lease), then the others
// together, and waits until each is ready. (Replicas started together on
// a fresh cluster are TestReplicasStartTogether's subject.)
func startReplicas(t *testing.T, natsURL string, n int, env ...string) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	rs[0] = startReplica(t, "r0", natsURL, env...)
	rs[0].waitReady(time.Minute)
	for i := 1; i < n; i++ {
		rs[i] = startReplica(t, fmt.Sprintf("r%d", i), natsURL, env...)
	}
	for _, r := range rs[1:] {
		r.waitReady(time.Minute)
	}
	return rs
}

// levelKey returns the lease key of a level stream, "level.DELAYD_1S"
// (deliver/internal/ownership.LevelKey).
func levelKey(stream string) string { return "level." + stream }

// routerKey is the router's lease key.
const routerKey = "router"

// replicaMetrics is what one scrape of a replica's /metrics said.
type replicaMetrics struct {
	held      map[string]bool   // lease key: delayd_lease_held is 1
	epoch     map[string]uint64 // lease key: delayd_lease_epoch
	failovers map[string]uint64 // lease key: delayd_failovers_total
	delivered map[string]uint64 // level stream: delayd_delivered_total
	fenced    map[string]uint64 // level stream: delayd_fenced_writes_total
}

// heldKeys returns the lease keys held, sorted.
func (m replicaMetrics) heldKeys() []string {
	var ks []string
	for k, h := range m.held {
		if h {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// heldLevels returns the indexes (1-based) of the levels of table whose
// lease is held.
func (m replicaMetrics) heldLevels(table levels.Table) []int {
	var out []int
	for _, lvl := range table.Levels() {
		if m.held[levelKey(lvl.Stream())] {
			out = append(out, lvl.Index)
		}
	}
	return out
}

var (
	metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"`)
)

// scrape reads the current process's /metrics (one second's timeout). It
// returns an error, without waiting, if the process has exited, has not
// logged its HTTP address yet, or does not answer (stopped).
func (r *replica) scrape() (replicaMetrics, error) {
	if !r.running() {
		return replicaMetrics{}, errors.New(r.name + ": not running")
	}
	addr := ""
	for _, e := range r.log.events() {
		if e.msg == "http endpoints" {
			addr = e.attr("addr")
		}
	}
	if addr == "" {
		return replicaMetrics{}, errors.New(r.name + ": no HTTP address yet")
	}
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return replicaMetrics{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return replicaMetrics{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return replicaMetrics{}, fmt.Errorf("%s: /metrics answered %d", r.name, resp.StatusCode)
	}
	return parseReplicaMetrics(string(body)), nil
}

// parseReplicaMetrics reads the lease and level metrics of a Prometheus
// text exposition.
func parseReplicaMetrics(text string) replicaMetrics {
	m := replicaMetrics{held: map[string]bool{}, epoch: map[string]uint64{}, failovers: map[string]uint64{},
		delivered: map[string]uint64{}, fenced: map[string]uint64{}}
	for _, line := range strings.Split(text, "\n") {
		sm := metricLine.FindStringSubmatch(line)
		if sm == nil {
			continue
		}
		labels := map[string]string{}
		for _, lp := range labelPair.FindAllStringSubmatch(sm[2], -1) {
			labels[lp[1]] = lp[2]
		}
		v, err := strconv.ParseFloat(sm[3], 64)
		if err != nil {
			continue
		}
		switch sm[1] {
		case "delayd_lease_held":
			m.held[labels["lease"]] = v == 1
		case "delayd_lease_epoch":
			m.epoch[labels["lease"]] = uint64(v)
		case "delayd_failovers_total":
			m.failovers[labels["lease"]] = uint64(v)
		case "delayd_delivered_total":
			m.delivered[labels["stream"]] = uint64(v)
		case "delayd_fenced_writes_total":
			m.fenced[labels["stream"]] = uint64(v)
		}
	}
	return m
}

// holders scrapes every running replica of rs except those in skip and
// returns the indexes of those that say they hold lease key now, with
// every scrape that answered.
func holders(rs []*replica, key string, skip ...int) ([]int, map[int]replicaMetrics) {
	var idx []int
	ms := map[int]replicaMetrics{}
	for i, r := range rs {
		if slices.Contains(skip, i) || !r.running() {
			continue
		}
		m, err := r.scrape()
		if err != nil {
			continue
		}
		ms[i] = m
		if m.held[key] {
			idx = append(idx, i)
		}
	}
	return idx, ms
}

// waitOwner waits up to timeout until exactly one replica of rs (not in
// skip) says it holds lease key, and returns its index and its scrape.
func waitOwner(t *testing.T, rs []*replica, key string, timeout time.Duration, skip ...int) (int, replicaMetrics) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := "no scrape"
	for {
		idx, ms := holders(rs, key, skip...)
		if len(idx) == 1 {
			return idx[0], ms[idx[0]]
		}
		last = fmt.Sprintf("holders %v", idx)
		if time.Now().After(deadline) {
			t.Fatalf("no single replica holds lease %q within %s (skipping %v): %s", key, timeout, skip, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultMark is a fault a test made: when, and which levels (1-based
// indexes) it touched, for failoverFigures.
type faultMark struct {
	name   string
	at     time.Time
	levels []int
}

// levelDeliveries returns the deliveries of a load at both targets (the
// target stream as report read it: call after report), by level index,
// sorted by arrival.
func (l *load) levelDeliveries() map[int][]itest.Delivery {
	l.mu.Lock()
	got := append(slices.Clone(l.streamGot), l.core.Snapshot()...)
	l.mu.Unlock()
	out := map[int][]itest.Delivery{}
	for _, d := range got {
		i, err := strconv.Atoi(d.Key)
		if err != nil || i < 0 || i >= l.cfg.Total {
			continue
		}
		lvl := i%l.cfg.Levels.Len() + 1
		out[lvl] = append(out[lvl], d)
	}
	for _, ds := range out {
		slices.SortFunc(ds, func(a, b itest.Delivery) int { return a.At.Compare(b.At) })
	}
	return out
}

// failoverFigure is what one level's deliveries looked like after a fault.
type failoverFigure struct {
	fault    string
	level    time.Duration // the level's delay
	gap      time.Duration // the longest time between two deliveries in a row that spans or follows the fault within its window
	gapFrom  time.Duration // when that gap began, after the fault (negative: before)
	lateness latency       // of the deliveries due within the fault's window
	n        int           // deliveries due within the window
}

func (f failoverFigure) String() string {
	return fmt.Sprintf("%s level %s: longest gap %s (from %s after the fault), lateness of the %d due in the window %s",
		f.fault, f.level, f.gap.Round(time.Millisecond), f.gapFrom.Round(time.Millisecond), f.n, f.lateness)
}

// gapSlack: a delivery gap that begins this close to the next fault (the
// last deliveries before a kill) belongs to the next fault.
const gapSlack = 100 * time.Millisecond

// failoverFigures measures, for each fault and each level it touched, the
// level's longest delivery gap that ends after the fault and begins before
// the fault's window closes (the window runs to the next fault, at most
// maxWindow; less gapSlack), and the lateness of the level's deliveries
// due in the window; and, per level, the lateness of the deliveries both
// due and delivered outside every window (normal). Figures are logged by
// the tests, not asserted.
func failoverFigures(byLevel map[int][]itest.Delivery, table levels.Table, marks []faultMark, maxWindow time.Duration) (figs []failoverFigure, normal map[int]latency) {
	end := func(k int) time.Time {
		e := marks[k].at.Add(maxWindow)
		if k+1 < len(marks) && marks[k+1].at.Before(e) {
			e = marks[k+1].at
		}
		return e
	}
	inWindow := func(t time.Time) bool {
		for k := range marks {
			if !t.Before(marks[k].at) && t.Before(end(k)) {
				return true
			}
		}
		return false
	}
	normal = map[int]latency{}
	for lvl, ds := range byLevel {
		var late []time.Duration
		for _, d := range ds {
			if !d.Due.IsZero() && !inWindow(d.Due) && !inWindow(d.At) {
				late = append(late, d.At.Sub(d.Due))
			}
		}
		normal[lvl] = summarize(late)
	}
	for k, m := range marks {
		for _, lvl := range m.levels {
			ds := byLevel[lvl]
			lv, _ := table.Level(lvl)
			f := failoverFigure{fault: m.name, level: lv.Delay}
			for j := 1; j < len(ds); j++ {
				a, b := ds[j-1].At, ds[j].At
				if b.After(m.at) && a.Before(end(k).Add(-gapSlack)) && b.Sub(a) > f.gap {
					f.gap, f.gapFrom = b.Sub(a), a.Sub(m.at)
				}
			}
			var late []time.Duration
			for _, d := range ds {
				if !d.Due.IsZero() && !d.Due.Before(m.at) && d.Due.Before(end(k)) {
					late = append(late, d.At.Sub(d.Due))
				}
			}
			f.n, f.lateness = len(late), summarize(late)
			figs = append(figs, f)
		}
	}
	return figs, normal
}

// summarize returns the p50, p99 and max of ds (zero if empty).
func summarize(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return latency{P50: itest.Percentile(ds, 50), P99: itest.Percentile(ds, 99), Max: ds[len(ds)-1]}
}

// logFailovers logs failoverFigures: one line per fault and level, then
// each level's normal lateness.
func logFailovers(t *testing.T, l *load, marks []faultMark, maxWindow time.Duration) {
	t.Helper()
	figs, normal := failoverFigures(l.levelDeliveries(), l.cfg.Levels, marks, maxWindow)
	var b strings.Builder
	for _, f := range figs {
		fmt.Fprintf(&b, "\n  %s", f)
	}
	for _, lvl := range l.cfg.Levels.Levels() {
		fmt.Fprintf(&b, "\n  level %s normal lateness (due and delivered outside every fault's window): %s", lvl.Delay, normal[lvl.Index])
	}
	t.Logf("failover figures (window: to the next fault, at most %s):%s", maxWindow, b.String())
}
