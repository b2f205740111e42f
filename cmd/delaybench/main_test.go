package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// TestSmoke runs every scenario with tiny sizes and checks correctness only:
// every row has lost == 0 and early == 0. It never asserts a speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario on embedded servers; skipped when testing.Short()")
	}
	cfg := config{
		N: 1000, Payload: PayloadDefault, BurstN: 1000, PendingN: 1000,
		SteadyRate: 500, SteadyDuration: 2 * time.Second, CancelRate: 100,
		JSON: true, CommandLine: "delaybench (smoke test)",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	if err := run(ctx, cfg, &stdout, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Scenario == "" {
			continue // a note
		}
		seen[r.Scenario+"/"+r.System+"/"+r.Target] = true
		if r.Cancels != nil && (r.Cancels.Both != 0 || r.Cancels.Cancelled == 0) {
			t.Errorf("%s: cancels %+v: want some cancelled and none cancelled and delivered", r.Scenario, *r.Cancels)
		}
		if r.Lost != 0 || r.Early != 0 {
			t.Errorf("%s %s %s: lost=%d early=%d (note: %s)", r.Scenario, r.System, r.Target, r.Lost, r.Early, r.Note)
		}
	}
	for _, want := range []string{
		"raw-publish/raw/stream", "raw-read/raw/stream", "ingest/delayd/stream",
		"burst/delayd/core", "burst/delayd/stream", "burst/native/stream",
		"steady/delayd/core", "steady/native/stream",
		"cancel-storm-off/delayd/core", "cancel-storm/delayd/core",
		"pending/delayd/core", "pending-own/delayd/", "pending/native/stream",
	} {
		if !seen[want] {
			t.Errorf("no row %s; got %v", want, seen)
		}
	}
}
