package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs every default scenario and burst-1m with tiny sizes, two
// steady rates and -targets, and checks correctness only: every row has
// lost == 0 and early == 0, each steady rate has its delayd row and its
// timer floor, compared with each other, the delayd burst rows carry
// native_ratio, and every one of issue 13's targets is reported once. It
// never asserts a speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario on embedded servers; skipped when testing.Short()")
	}
	cfg := config{
		N: 1000, Payload: PayloadDefault, BurstN: 1000, BurstOneMN: 1500, PendingN: 1000,
		SteadyRates: []int{500, 700}, SteadyDuration: 2 * time.Second, CancelRate: 100, TrickleRate: 100,
		Scenarios: append(slices.Clone(defaultScenarios), "burst-1m"), Targets: true,
		JSON: true, CommandLine: "delaybench (smoke test)",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	if err := run(ctx, cfg, &stdout, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	wantRef := map[string]string{
		"burst/delayd/core": "ref-drain", "burst/delayd/stream": "ref-stream", "ingest/delayd/stream": "ref-move",
		"steady/delayd/core@500": "ref-timer", "steady/delayd/core@700": "ref-timer", "cross-level-burst/delayd/core": "cross-level-quiet",
	}
	seen := map[string]bool{}
	goals := checkTargets(t, stdout.Bytes(), map[string]string{"burst-1m-core": "", "burst-1m-stream": "", "steady-10k": StatusNotRun, "steady-30k": StatusNotRun, "lost-early": StatusMet})
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Scenario == "" {
			continue // a note or a target
		}
		key := r.Scenario + "/" + r.System + "/" + r.Target
		if r.Rate > 0 {
			key += "@" + strconv.Itoa(r.Rate)
		}
		seen[key] = true
		if (r.Scenario == "burst" || r.Scenario == "burst-1m") && r.System == "delayd" && (r.NativeRatio == nil || *r.NativeRatio <= 0) {
			t.Errorf("%s: native_ratio %v, want one (native ran in the same run)", key, deref(r.NativeRatio))
		}
		// Every reference runs before the rows compared with it.
		if ref, ok := wantRef[key]; ok {
			lat := ref == "ref-timer" || ref == "cross-level-quiet"
			if r.Ref != ref || (lat && r.OverRef == nil) || (!lat && (r.RefRatio == nil || *r.RefRatio <= 0)) {
				t.Errorf("%s: ref %q ref_ratio %v over_ref_ms %v: want a comparison with %s", key, r.Ref, r.RefRatio, r.OverRef, ref)
			}
		}
		if r.Cancels != nil && (r.Cancels.Both != 0 || r.Cancels.Cancelled == 0) {
			t.Errorf("%s: cancels %+v: want some cancelled and none cancelled and delivered", r.Scenario, *r.Cancels)
		}
		if r.Lost != 0 || r.Early != 0 {
			t.Errorf("%s %s %s: lost=%d early=%d (note: %s)", r.Scenario, r.System, r.Target, r.Lost, r.Early, r.Note)
		}
	}
	for _, want := range []string{
		"raw-publish/raw/stream", "raw-read/raw/stream",
		"ref-drain/raw/core", "ref-stream/raw/stream", "ref-move/raw/stream", "ref-timer/raw/core@500", "ref-timer/raw/core@700",
		"ingest/delayd/stream",
		"burst/delayd/core", "burst/delayd/stream", "burst/native/stream",
		"burst-1m/delayd/core", "burst-1m/delayd/stream", "burst-1m/native/stream",
		"steady/delayd/core@500", "steady/delayd/core@700", "steady/native/stream@500",
		"cancel-storm-off/delayd/core", "cancel-storm/delayd/core",
		"pending/delayd/core", "pending-own/delayd/", "pending/native/stream",
		"cross-level-quiet/delayd/core", "cross-level-burst/delayd/core", "cross-level-bulk/delayd/stream",
	} {
		if !seen[want] {
			t.Errorf("no row %s; got %v", want, seen)
		}
	}
	if seen["steady/native/stream@700"] {
		t.Errorf("a native steady row at 700/s: native runs at the first rate only")
	}
	if g := goals["burst-1m-core"]; g.Ratio == nil || !strings.Contains(g.Figure, "1500 messages") {
		t.Errorf("burst-1m-core target: ratio %v figure %q, want burst-1m's ratio at its 1500 messages", deref(g.Ratio), g.Figure)
	}
}

// checkTargets reads the target objects of a -json -targets run's output:
// each of issue 13's targets once, with a status, and the status want
// gives ("": run, met or not). It returns them by ID.
func checkTargets(t *testing.T, out []byte, want map[string]string) map[string]goal {
	t.Helper()
	goals := map[string]goal{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var g goal
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil || g.ID == "" {
			continue
		}
		if _, dup := goals[g.ID]; dup {
			t.Errorf("target %s twice", g.ID)
		}
		goals[g.ID] = g
	}
	for _, id := range []string{"burst-core", "burst-stream", "ingest", "burst-1m-core", "burst-1m-stream", "steady-10k", "steady-30k", "sustained", "cross-level", "lost-early"} {
		g, ok := goals[id]
		switch w, set := want[id]; {
		case !ok:
			t.Errorf("no target %s in the output", id)
		case set && w != "" && g.Status != w:
			t.Errorf("target %s: %s (%s), want %s", id, g.Status, g.Figure, w)
		case set && w == "" && g.Status != StatusMet && g.Status != StatusNotMet:
			t.Errorf("target %s: %s (%s), want it run", id, g.Status, g.Figure)
		case g.Status != StatusMet && g.Status != StatusNotMet && g.Status != StatusNotRun:
			t.Errorf("target %s: status %q", id, g.Status)
		}
	}
	return goals
}

// TestCluster runs the cluster scenario tiny (two kills, two graceful
// stops) and checks correctness only: every row has lost == 0, early == 0
// and no duplicates at the stream target; each kill left the owner's
// leases to expire (at least the level's lease per kill) while each
// graceful stop released them all. It never asserts a speed.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts eight servers and clusters with delayd services; skipped when testing.Short()")
	}
	const kills = 2
	cfg := config{
		Payload: PayloadDefault, ClusterBurstN: 500, ClusterRate: 200, ClusterDur: 2 * time.Second, ClusterKills: kills,
		Scenarios: []string{"cluster"}, JSON: true, CommandLine: "delaybench (cluster test)",
		N: 1, BurstN: 1, PendingN: 1, SteadyRates: []int{1}, SteadyDuration: time.Second, CancelRate: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Scenario == "" {
			continue // a note
		}
		if r.Cluster == nil {
			t.Errorf("%s: no cluster set-up in the row", sc.Text())
			continue
		}
		key := fmt.Sprintf("%s/R%d/%d", r.Scenario, r.Cluster.StreamReplicas, r.Cluster.Replicas)
		seen[key]++
		if r.Lost != 0 || r.Early != 0 {
			t.Errorf("%s: lost=%d early=%d (note: %s)", key, r.Lost, r.Early, r.Note)
		}
		if r.Target == "stream" && (r.Duplicates == nil || *r.Duplicates != 0) {
			t.Errorf("%s: duplicates %v at the stream target, want 0", key, r.Duplicates)
		}
		switch r.Scenario {
		case "cluster-failover-kill", "cluster-failover-graceful":
			if r.Events != kills || r.Gap == nil || r.Unreleased == nil {
				t.Errorf("%s: events %d (want %d), gap %v, unreleased %v", key, r.Events, kills, r.Gap, r.Unreleased)
				continue
			}
			if kill := r.Scenario == "cluster-failover-kill"; kill && *r.Unreleased < kills {
				t.Errorf("%s: %d lease terms ended unreleased over %d kills, want at least one (the level's) per kill", key, *r.Unreleased, kills)
			} else if !kill && *r.Unreleased != 0 {
				t.Errorf("%s: %d lease terms ended unreleased over graceful stops, want 0", key, *r.Unreleased)
			}
		}
	}
	var want []string
	for _, s := range []string{"cluster-burst", "cluster-steady"} {
		want = append(want, s+"/R1/1", s+"/R3/1", s+"/R3/2", s+"/R3/3")
	}
	want = append(want, "cluster-failover-kill/R3/3", "cluster-failover-graceful/R3/3")
	for _, w := range want {
		if seen[w] != 1 {
			t.Errorf("row %s seen %d times, want once; got %v", w, seen[w], seen)
		}
	}
	if t.Failed() {
		t.Logf("rows:\n%s\nprogress:\n%s", stdout.String(), stderr.String())
	}
}

// TestSustained runs the sustained scenario tiny (two low rates, 1 s each)
// and checks correctness only: every row has lost == 0 and early == 0, the
// scenario measured raw publish itself (raw not named), one row per step
// up to the first unbounded one, and a sustained-max row with its ratio to
// raw publish if a step was bounded. It never asserts a speed.
func TestSustained(t *testing.T) {
	if testing.Short() {
		t.Skip("runs delayd on an embedded server; skipped when testing.Short()")
	}
	cfg := config{
		N: 1000, Payload: PayloadDefault, SustainedRates: []int{200, 400}, SustainedStep: time.Second,
		Scenarios: []string{"sustained"}, JSON: true, CommandLine: "delaybench (sustained test)",
		BurstN: 1, PendingN: 1, SteadyRates: []int{1}, SteadyDuration: time.Second, CancelRate: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	if err := run(ctx, cfg, &stdout, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	seen := map[string]int{}
	var max result
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Scenario == "" {
			continue
		}
		seen[r.Scenario]++
		if r.Scenario == "sustained-max" {
			max = r
			continue
		}
		if r.Lost != 0 || r.Early != 0 {
			t.Errorf("%s %s: lost=%d early=%d (note: %s)", r.Scenario, r.System, r.Lost, r.Early, r.Note)
		}
	}
	if seen["raw-publish"] != 1 || seen["sustained-max"] != 1 || seen["sustained"] < 1 || seen["sustained"] > 2 {
		t.Errorf("rows %v: want raw-publish once, 1-2 sustained steps, sustained-max once", seen)
	}
	if max.N > 0 && (max.RawRatio == nil || *max.RawRatio <= 0) {
		t.Errorf("sustained-max %+v: a bounded step but no ratio to raw publish", max)
	}
	if t.Failed() {
		t.Logf("rows:\n%s", stdout.String())
	}
}

// TestSmokeTCP runs every -tcp scenario but sustained (TestSustained's)
// tiny, burst-1m and two steady rates included, with -targets, with
// nats-server and delayd as processes over TCP, and checks correctness
// only: every row has lost == 0 and early == 0 and says it ran over TCP,
// the targets are reported (over TCP), and every process the run started
// has exited by its end. It never asserts a speed.
func TestSmokeTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and delayd and runs them as processes; skipped when testing.Short()")
	}
	cfg := config{
		N: 1000, Payload: PayloadDefault, BurstN: 1000, BurstOneMN: 1500, PendingN: 1,
		SteadyRates: []int{500, 700}, SteadyDuration: 2 * time.Second, CancelRate: 100, TrickleRate: 100,
		Scenarios: slices.DeleteFunc(slices.Clone(tcpScenarios), func(s string) bool { return s == "sustained" }),
		TCP:       true, JSON: true, Targets: true, CommandLine: "delaybench (tcp smoke test)",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	before := children(t)
	if err := run(ctx, cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if after := children(t); after > before {
		t.Errorf("%d child processes after the run, %d before: a nats-server or delayd process left running", after, before)
	}
	seen := map[string]bool{}
	goals := checkTargets(t, stdout.Bytes(), map[string]string{"burst-1m-core": "", "burst-1m-stream": "", "lost-early": StatusMet})
	for id, g := range goals {
		if g.Transport != "tcp" {
			t.Errorf("target %s: transport %q, want tcp", id, g.Transport)
		}
	}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Scenario == "" {
			continue
		}
		key := r.Scenario + "/" + r.System + "/" + r.Target
		if r.Rate > 0 {
			key += "@" + strconv.Itoa(r.Rate)
		}
		seen[key] = true
		if r.Transport != "tcp" {
			t.Errorf("%s: transport %q, want tcp", key, r.Transport)
		}
		if r.Lost != 0 || r.Early != 0 {
			t.Errorf("%s: lost=%d early=%d (note: %s)", key, r.Lost, r.Early, r.Note)
		}
	}
	for _, want := range []string{
		"raw-publish/raw/stream", "ref-drain/raw/core", "ref-stream/raw/stream", "ref-move/raw/stream", "ref-timer/raw/core@500", "ref-timer/raw/core@700",
		"ingest/delayd/stream", "burst/delayd/core", "burst/delayd/stream", "burst-1m/delayd/core", "burst-1m/delayd/stream", "burst-1m/native/stream",
		"steady/delayd/core@500", "steady/delayd/core@700",
		"cancel-storm/delayd/core", "cross-level-burst/delayd/core",
	} {
		if !seen[want] {
			t.Errorf("no row %s; got %v", want, seen)
		}
	}
	if t.Failed() {
		t.Logf("rows:\n%s\nprogress:\n%s", stdout.String(), stderr.String())
	}
}

// children counts this process's live child processes (Linux /proc: 0
// elsewhere), zombies left out.
func children(t *testing.T) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	n := 0
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after its ')'.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) > 1 && fields[0] != "Z" && fields[1] == strconv.Itoa(os.Getpid()) {
			n++
		}
	}
	return n
}
