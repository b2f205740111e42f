package main

import (
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/deliver"
)

// TestPrintStatsRouters: with ingress partitions, stats prints a line per router under its process: lease,
// partition, whether it routes, epoch and counters; without, none.
func TestPrintStatsRouters(t *testing.T) {
	now := time.Now()
	rep := &statsReport{Time: now, Replicas: []deliver.StatsReply{{
		Started: now, PID: 42, Holder: "h", Routed: 9,
		Routers: []deliver.RouterReply{
			{IngressPartition: 0, Lease: "router.0", Owner: true, Epoch: 3, Routed: 7, Clamped: 1, DeadLettered: 4},
			{IngressPartition: 1, Lease: "router.1", Epoch: 2, Routed: 2},
		},
	}}}
	var b strings.Builder
	if err := printStats(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"router.0 (ingress partition 0): routing, epoch 3, routed 7, clamped 1, dead-lettered 4\n",
		"router.1 (ingress partition 1): not routing, epoch 2, routed 2, clamped 0, dead-lettered 0\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("stats output lacks %q:\n%s", want, b.String())
		}
	}
	rep.Replicas[0].Routers = nil
	b.Reset()
	if err := printStats(&b, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "ingress partition") {
		t.Errorf("stats output without ingress partitions names one:\n%s", b.String())
	}
}
