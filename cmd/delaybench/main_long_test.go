//go:build long

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"
)

// clusterTestLeaseTTL is TestCluster's lease TTL: ten times delayd's
// default, as the integration harness's (integration/internal/itest).
const clusterTestLeaseTTL = 15 * time.Second

// TestCluster runs the cluster scenario tiny (two kills, two graceful
// stops) and checks correctness only: every row has lost == 0, early == 0
// and no duplicates at the stream target; each kill left the owner's
// leases to expire (at least the level's lease per kill) while each
// graceful stop released them all. It never asserts a speed.
//
// Every lease has a 15 s TTL (clusterTestLeaseTTL), not delayd's 1.5 s:
// the whole cluster runs in this one process, and under -race on a busy
// 2-core machine a renewal stalled past 1.35 s, so delaybench's own hold
// of DELAYD_1S's lease expired and a service took the level before T
// ("the benchmark lost DELAYD_1S's lease before T", "replica 0 holds
// level.DELAYD_1S"), and the services' own leases changed hands while
// measured. Each kill then stalls the level about 15 s.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts eight servers and clusters with delayd services; skipped when testing.Short()")
	}
	const kills = 2
	cfg := config{
		Payload: PayloadDefault, ClusterBurstN: 500, ClusterRate: 200, ClusterDur: 2 * time.Second, ClusterKills: kills,
		ClusterLeaseTTL: clusterTestLeaseTTL,
		Scenarios:       []string{"cluster"}, JSON: true, CommandLine: "delaybench (cluster test)",
		N: 1, BurstN: 1, PendingN: 1, SteadyRates: []int{1}, SteadyDuration: time.Second, CancelRate: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // liveness only: 467 s under -race on a starved machine with 15 s leases
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
		SteadyRates: []int{500, 700}, SteadyDuration: 2 * time.Second, CancelRate: 50, CancelShare: 1, TrickleRate: 100,
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
