package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// result is one row.
type result struct {
	Scenario string `json:"scenario"`
	System   string `json:"system"` // "delayd", "native" or "raw"
	Target   string `json:"target,omitempty"`
	// Rate is the rate offered, msg/s (steady and ref-timer rows, one per
	// -steady-rates; shown in the table as "steady 30k/s").
	Rate     int       `json:"rate,omitempty"`
	N        int       `json:"n"`
	MsgsPerS float64   `json:"msgs_per_s,omitempty"`
	Lateness *lateness `json:"lateness_ms,omitempty"`
	Lost     int       `json:"lost"`
	Early    int       `json:"early"`
	// HeapPerPending is heap bytes per pending message (pending rows only).
	HeapPerPending *float64 `json:"heap_bytes_per_pending,omitempty"`
	// HeapBytes is the heap difference the row measures (pending rows only).
	HeapBytes *int64 `json:"heap_bytes,omitempty"`
	// Cancels is what the cancel requests were answered (cancel-storm rows only).
	Cancels *cancelCounts `json:"cancels,omitempty"`
	// Reschedules is what the reschedule requests were answered, and the
	// moved messages' deliveries (reschedule-storm rows only).
	Reschedules *rescheduleCounts `json:"reschedules,omitempty"`
	// P99Ratio is lateness p99 with cancels (reschedules) over p99 without
	// (cancel-storm and reschedule-storm rows only).
	P99Ratio *float64 `json:"p99_ratio,omitempty"`
	// Cluster is the set-up of a cluster row: nodes, stream replicas and
	// delayd replicas (cluster rows only).
	Cluster *clusterSetup `json:"cluster,omitempty"`
	// Duplicates counts deliveries beyond the first of a message, by
	// payload index (cluster rows only; other rows note them).
	Duplicates *int `json:"duplicates,omitempty"`
	// R3OverR1 is the row's figure over the R1 reference's, both measured
	// in this run: msgs_per_s for cluster-burst, lateness p99 for
	// cluster-steady (cluster R3 rows only).
	R3OverR1 *float64 `json:"r3_over_r1,omitempty"`
	// Events is how many times the level's owner was stopped, and Gap the
	// level's longest delivery gap after each stop, in ms, over the
	// events (cluster-failover rows only).
	Events int       `json:"events,omitempty"`
	Gap    *lateness `json:"gap_ms,omitempty"`
	// Unreleased counts the stopped owners' lease terms that ended without
	// a release (cluster-failover rows only): a kill leaves every lease it
	// held to expire, a graceful stop releases them all (0).
	Unreleased *int `json:"unreleased_terms,omitempty"`
	// Ref is the scenario of the reference row measured earlier in this
	// run that RefRatio or OverRef compare the row with (delayd rows whose
	// reference ran: burst core with ref-drain, burst stream with
	// ref-stream, ingest with ref-move, steady with ref-timer).
	Ref string `json:"ref,omitempty"`
	// RefRatio is msgs_per_s over Ref's.
	RefRatio *float64 `json:"ref_ratio,omitempty"`
	// OverRef is the lateness minus Ref's, in ms: p50, p99 and max each
	// minus Ref's.
	OverRef *lateness `json:"over_ref_ms,omitempty"`
	// RawRatio is msgs_per_s over raw-publish's in this run (ingest,
	// burst and sustained-max rows, when raw ran).
	RawRatio *float64 `json:"raw_ratio,omitempty"`
	// NativeRatio is the row's last arrival after due (lateness max) over
	// the native stream row's of the same scenario and run (delayd burst
	// and burst-1m rows).
	NativeRatio *float64 `json:"native_ratio,omitempty"`
	// DeliveredPerS is the rate of deliveries, distinct messages over the
	// time from the first arrival to the last (sustained rows only).
	DeliveredPerS float64 `json:"delivered_per_s,omitempty"`
	// Transport is "tcp" for a row of a -tcp run (nats-server and delayd
	// as processes), empty in-process.
	Transport string `json:"transport,omitempty"`
	Note      string `json:"note,omitempty"`
}

// refOf names each row's reference ("scenario/system/target" to the
// reference's scenario) and whether the comparison is of msgs/s (a
// ratio) or of lateness (a difference).
var refOf = map[string]struct {
	ref      string
	lateness bool
}{
	"burst/delayd/core":    {"ref-drain", false},
	"burst/delayd/stream":  {"ref-stream", false},
	"ingest/delayd/stream": {"ref-move", false},
	"steady/delayd/core":   {"ref-timer", true},
	// The trickle's lateness during the burst over its own without.
	"cross-level-burst/delayd/core": {"cross-level-quiet", true},
}

// rawRatioOf are the scenarios whose rows get raw_ratio.
var rawRatioOf = []string{"ingest", "burst", "sustained-max"}

// refKey is the key under which r is remembered as a reference, and
// looked up as one: its scenario, and its rate if it has one (ref-timer
// at 30,000 msg/s is "ref-timer@30000", the reference of steady at the
// same rate).
func refKey(scenario string, rate int) string {
	if rate > 0 {
		return scenario + "@" + strconv.Itoa(rate)
	}
	return scenario
}

// relate fills r's comparisons with the reference rows seen so far, and
// remembers r as a reference for later rows.
func (o *output) relate(r *result) {
	if _, ok := o.refs[refKey(r.Scenario, r.Rate)]; !ok {
		o.refs[refKey(r.Scenario, r.Rate)] = *r
	}
	if raw, ok := o.refs["raw-publish"]; ok && raw.MsgsPerS > 0 && r.MsgsPerS > 0 && slices.Contains(rawRatioOf, r.Scenario) {
		v := r.MsgsPerS / raw.MsgsPerS
		r.RawRatio = &v
	}
	how, ok := refOf[r.Scenario+"/"+r.System+"/"+r.Target]
	if !ok {
		return
	}
	ref, ok := o.refs[refKey(how.ref, r.Rate)]
	if !ok {
		return
	}
	switch {
	case how.lateness && ref.Lateness != nil && r.Lateness != nil:
		r.Ref = how.ref
		r.OverRef = &lateness{P50: r.Lateness.P50 - ref.Lateness.P50, P99: r.Lateness.P99 - ref.Lateness.P99, Max: r.Lateness.Max - ref.Lateness.Max}
	case !how.lateness && ref.MsgsPerS > 0 && r.MsgsPerS > 0:
		r.Ref = how.ref
		v := r.MsgsPerS / ref.MsgsPerS
		r.RefRatio = &v
	}
}

// clusterSetup is where a cluster row ran.
type clusterSetup struct {
	Nodes          int `json:"nodes"`           // nats-server nodes
	StreamReplicas int `json:"stream_replicas"` // replicas of every stream delayd creates (R)
	Replicas       int `json:"replicas"`        // delayd services, each on its own connection to a node of its own
}

// lateness is a distribution in milliseconds, over every message.
type lateness struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// tally is what a run's arrivals show.
type tally struct {
	distinct int
	dups     int
	early    int
	lost     int
	lateness *lateness
	first    time.Time // earliest arrival
	last     time.Time // latest arrival
}

// count tallies arrivals of messages 0..n-1: each index counts once (its
// first arrival), early means arrival before a.due, lateness is arrival −
// base(a).
func count(arrs []arrival, n int, base func(a arrival) time.Time) tally {
	var t tally
	seen := make([]bool, n)
	lat := make([]time.Duration, 0, len(arrs))
	for _, a := range arrs {
		if a.idx < 0 || a.idx >= n {
			continue
		}
		if seen[a.idx] {
			t.dups++
			continue
		}
		seen[a.idx] = true
		t.distinct++
		if !a.due.IsZero() && a.at.Before(a.due) {
			t.early++
		}
		if base != nil {
			lat = append(lat, a.at.Sub(base(a)))
		}
		if a.at.After(t.last) {
			t.last = a.at
		}
		if t.first.IsZero() || a.at.Before(t.first) {
			t.first = a.at
		}
	}
	t.lost = n - t.distinct
	if len(lat) > 0 {
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		t.lateness = &lateness{P50: ms(pct(lat, 50)), P99: ms(pct(lat, 99)), Max: ms(lat[len(lat)-1])}
	}
	return t
}

// pct is the nearest-rank p-th percentile of sorted durations.
func pct(sorted []time.Duration, p float64) time.Duration {
	rank := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// output writes rows as tables (flushed at the end: cluster rows in a
// table of their own) or JSON lines.
type output struct {
	cfg     config
	w       io.Writer
	tw      *tabwriter.Writer
	cluster []result
	notes   []string
	refs    map[string]result // the first row of each scenario, by refKey
	rows    []result          // every row written, as written (for -targets)
}

func newOutput(cfg config, w io.Writer) *output {
	return &output{cfg: cfg, w: w, tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight), refs: map[string]result{}}
}

func (o *output) header() {
	if o.cfg.JSON {
		return
	}
	how := "embedded, in-process"
	if o.cfg.TCP {
		how = "a process of its own, over TCP on loopback; delayd a process of its own"
	}
	fmt.Fprintf(o.w, "delaybench  %s  %s/%s  NumCPU=%d  %s  nats-server %s (%s)\n",
		time.Now().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), server.VERSION, how)
	fmt.Fprintf(o.w, "command: %s\n", o.cfg.CommandLine)
	rates := make([]string, len(o.cfg.SteadyRates))
	for i, r := range o.cfg.SteadyRates {
		rates[i] = strconv.Itoa(r)
	}
	burst1M := ""
	if o.cfg.wants("burst-1m") {
		burst1M = fmt.Sprintf(" burst-1m-n=%d", o.cfg.BurstOneMN)
	}
	fmt.Fprintf(o.w, "payload %d B; n=%d burst-n=%d%s; steady %s msg/s for %s; cancel-rate %d/s; pending-n=%d; lateness in ms over every message\n\n",
		o.cfg.Payload, o.cfg.N, o.cfg.BurstN, burst1M, strings.Join(rates, ","), o.cfg.SteadyDuration, o.cfg.CancelRate, o.cfg.PendingN)
	if o.cfg.wants("cluster") {
		fmt.Fprintf(o.w, "cluster: cluster-burst-n=%d; %d msg/s, steady for %s; %d kills and %d graceful stops; every node and service in this process\n",
			o.cfg.ClusterBurstN, o.cfg.ClusterRate, o.cfg.ClusterDur, o.cfg.ClusterKills, o.cfg.ClusterKills)
	}
	if slices.ContainsFunc(scenarioNames, func(s string) bool { return s != "cluster" && o.cfg.wants(s) }) {
		fmt.Fprintln(o.tw, "scenario\tsystem\ttarget\tn\tmsgs/s\tp50 ms\tp99 ms\tmax ms\tlost\tearly\theap B/pending\tvs reference\t×raw\tmax ×native\t")
	}
}

func (o *output) row(r result) {
	o.relate(&r)
	if o.cfg.TCP {
		r.Transport = "tcp"
	}
	o.rows = append(o.rows, r)
	if o.cfg.JSON {
		b, _ := json.Marshal(r)
		fmt.Fprintln(o.w, string(b))
		return
	}
	if r.Cluster != nil {
		o.cluster = append(o.cluster, r)
		return
	}
	dash := "-"
	rate, p50, p99, mx, heap := dash, dash, dash, dash, dash
	if r.MsgsPerS > 0 {
		rate = fmt.Sprintf("%.0f", r.MsgsPerS)
	}
	if r.Lateness != nil {
		p50, p99, mx = fmt.Sprintf("%.1f", r.Lateness.P50), fmt.Sprintf("%.1f", r.Lateness.P99), fmt.Sprintf("%.1f", r.Lateness.Max)
	}
	if r.HeapPerPending != nil {
		heap = fmt.Sprintf("%.1f", *r.HeapPerPending)
	}
	if r.HeapBytes != nil {
		heap += fmt.Sprintf(" (%s)", mib(*r.HeapBytes))
	}
	target := r.Target
	if target == "" {
		target = dash
	}
	vsRef, vsRaw, vsNative := dash, dash, dash
	if r.RefRatio != nil {
		vsRef = fmt.Sprintf("%.2f× %s", *r.RefRatio, r.Ref)
	}
	if r.OverRef != nil {
		vsRef = fmt.Sprintf("p99 %+.1f, max %+.1f ms over %s", r.OverRef.P99, r.OverRef.Max, r.Ref)
	}
	if r.RawRatio != nil {
		vsRaw = fmt.Sprintf("%.2f", *r.RawRatio)
	}
	if r.NativeRatio != nil {
		vsNative = fmt.Sprintf("%.2f", *r.NativeRatio)
	}
	name := r.Scenario
	if r.Rate > 0 {
		name += " " + rateLabel(r.Rate)
	}
	fmt.Fprintf(o.tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", name, r.System, target, r.N, rate, p50, p99, mx, r.Lost, r.Early, heap, vsRef, vsRaw, vsNative)
	if r.Note != "" {
		o.notes = append(o.notes, fmt.Sprintf("%s/%s/%s: %s", name, r.System, target, r.Note))
	}
}

// note adds a line under the table (a JSON line {"note": …} with -json).
func (o *output) note(s string) {
	if o.cfg.JSON {
		b, _ := json.Marshal(map[string]string{"note": s})
		fmt.Fprintln(o.w, string(b))
		return
	}
	o.notes = append(o.notes, s)
}

func (o *output) footer(elapsed time.Duration) {
	if o.cfg.JSON {
		if o.cfg.Targets {
			o.targets()
		}
		return
	}
	_ = o.tw.Flush()
	o.clusterTable()
	for _, n := range o.notes {
		fmt.Fprintln(o.w, "note: "+n)
	}
	if o.cfg.Targets {
		o.targets()
	}
	fmt.Fprintf(o.w, "total %s\n", elapsed.Round(100*time.Millisecond))
}

// rateLabel is a rate in msg/s as the table shows it: "10k/s", "2500/s".
func rateLabel(rate int) string {
	if rate >= 1000 && rate%1000 == 0 {
		return fmt.Sprintf("%dk/s", rate/1000)
	}
	return fmt.Sprintf("%d/s", rate)
}

// clusterTable writes the cluster rows: for cluster-failover rows, n is
// the messages of the load and p50/p99/max are the gap over the events.
func (o *output) clusterTable() {
	if len(o.cluster) == 0 {
		return
	}
	tw := tabwriter.NewWriter(o.w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(o.w)
	fmt.Fprintln(tw, "cluster scenario\ttarget\tnodes\tR\treplicas\tn\tmsgs/s\tp50 ms\tp99 ms\tmax ms\tlost\tearly\tdups\tR3/R1\tevents\t")
	f := func(v float64, format string) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf(format, v)
	}
	for _, r := range o.cluster {
		p50, p99, mx := "-", "-", "-"
		if d := cmp.Or(r.Gap, r.Lateness); d != nil {
			p50, p99, mx = fmt.Sprintf("%.1f", d.P50), fmt.Sprintf("%.1f", d.P99), fmt.Sprintf("%.1f", d.Max)
		}
		dups, ratio, events := "-", "-", "-"
		if r.Duplicates != nil {
			dups = fmt.Sprint(*r.Duplicates)
		}
		if r.R3OverR1 != nil {
			ratio = fmt.Sprintf("%.2f", *r.R3OverR1)
		}
		if r.Events > 0 {
			events = fmt.Sprint(r.Events)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t\n", r.Scenario, r.Target, r.Cluster.Nodes,
			r.Cluster.StreamReplicas, r.Cluster.Replicas, r.N, f(r.MsgsPerS, "%.0f"), p50, p99, mx, r.Lost, r.Early, dups, ratio, events)
		if r.Note != "" {
			o.notes = append(o.notes, fmt.Sprintf("%s/R%d/%d replicas: %s", r.Scenario, r.Cluster.StreamReplicas, r.Cluster.Replicas, r.Note))
		}
	}
	_ = tw.Flush()
}

func mib(b int64) string {
	sign := ""
	if b < 0 {
		sign, b = "-", -b
	}
	return fmt.Sprintf("%s%.2f MiB", sign, float64(b)/(1<<20))
}

// notes joins non-empty notes.
func notes(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}
