//go:build long && unix

package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestClusterCancelTwoReplicas runs two delayd replicas on a 3-node cluster
// (R3): r0, started first, owns every level; r1 owns none. Cancels sent to
// the cancel API (a queue group: either replica takes each) are all
// decided while both run, r1 answering some of them "cancelled" through
// the owner's decide subject. Then r0, the owner, is killed with SIGKILL
// and restarted while the rest are cancelled (sent again until a final
// answer). No message answered "cancelled" is delivered, every one
// answered "already delivered" was, and every message not cancelled is
// delivered exactly once, never early, to the stream target.
func TestClusterCancelTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("long fault test on a 3-node cluster: skipped when testing.Short()")
	}
	c := natstest.StartCluster(t, 3)
	// A 5 s lease TTL, not the kill tests' 500 ms: the first half's
	// cancels must each be decided on the first try, which a lease of
	// r0's expired by a renewal stall under -race would refuse. The kill
	// phase retries each cancel for a minute, and its messages fall due
	// 10 s after their publish: a 5 s wait for r0's leases fits in both.
	env := []string{"DELAYD_LEVELS=3s 10s", "DELAYD_LEASE_TTL=5s"}
	b := &itest.Bundle{T: t}
	b.NC, b.JS = c.Connect(0)
	r0 := startReplica(t, "r0", c.URLs(), env...)
	r0.waitReady(time.Minute)
	itest.WaitFor(t, time.Minute, "r0 owns the router and every level", func() bool {
		m, err := b.NC.Request(contract.StatsSubject, nil, 5*time.Second)
		if err != nil {
			return false
		}
		var s deliver.StatsReply
		if json.Unmarshal(m.Data, &s) != nil || !s.RouterOwner || len(s.Levels) == 0 {
			return false
		}
		for _, l := range s.Levels {
			if !l.Owner {
				return false
			}
		}
		return true
	})
	r1 := startReplica(t, "r1", c.URLs(), env...)
	r1.waitReady(time.Minute)

	b.CreateStream("DCAN", "dcan.>")
	const total = 400
	rec := itest.NewRecorder(t)
	for i := range total {
		b.Publish("delay.dcan.x", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {fmt.Sprintf("dc-%d", i)}})
		rec.ExpectKeys(fmt.Sprint(i))
	}
	lastDue := time.Now().Add(10 * time.Second)

	replies := map[int]string{}
	cancelOnce := func(i int) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m, err := b.NC.RequestWithContext(ctx, contract.CancelSubject, []byte(fmt.Sprintf("dc-%d", i)))
		if err != nil {
			return "", err
		}
		return string(m.Data), nil
	}
	final := func(a string) bool {
		return a == contract.CancelReplyCancelled || a == contract.CancelReplyDelivered || a == contract.CancelReplyNotFound
	}
	// Both replicas run: every request is decided at once, whichever
	// replica takes it.
	for i := 0; i < total/2; i += 2 {
		a, err := cancelOnce(i)
		if err != nil || !final(a) {
			t.Errorf("cancel dc-%d while both replicas run: %q, %v; want a decision", i, a, err)
			continue
		}
		replies[i] = a
	}
	_, metrics, err := r1.get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	byR1 := promValue(metrics, `delayd_cancel_requests_total{result="cancelled"}`)
	if byR1 == 0 {
		t.Errorf("r1, which owns no level, answered no cancel \"cancelled\": the test did not route one to the owner")
	}
	// The owner dies mid-cancels, and comes back.
	r0.kill9()
	r0.restart()
	for i := total / 2; i < total; i += 2 {
		deadline := time.Now().Add(time.Minute)
		for {
			a, err := cancelOnce(i)
			if err == nil && final(a) {
				replies[i] = a
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cancel dc-%d: no decision within a minute of retries; last %q, %v", i, a, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	counts := map[string]int{}
	for i, a := range replies {
		counts[a]++
		if a == contract.CancelReplyCancelled {
			rec.Excused(fmt.Sprint(i), "cancelled")
		}
	}
	want := total - counts[contract.CancelReplyCancelled]
	itest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d delivered (replies %v)", want, counts), func() bool {
		return b.StreamCount("DCAN") >= uint64(want)
	})
	time.Sleep(time.Until(lastDue)) // every due time passes: a cancelled message delivered late would show
	itest.WaitQuiet(t, 2*time.Second, time.Minute, func() int { return int(b.StreamCount("DCAN")) })
	rec.AddStream(b.StreamMsgs("DCAN"))
	delivered := rec.Counts()
	t.Logf("cancel replies: %v (r1, owning no level, answered %v of the first half's cancelled); delivered %d distinct of %d", counts, byR1, len(delivered), total)
	rec.CheckAll()
	for i, a := range replies {
		if a == contract.CancelReplyDelivered && delivered[fmt.Sprint(i)] != 1 {
			t.Errorf("dc-%d: answered already delivered, delivered %d times", i, delivered[fmt.Sprint(i)])
		}
		if a == contract.CancelReplyNotFound {
			t.Errorf("dc-%d: answered not found; its PubAck was seen before the cancel", i)
		}
	}
	if counts[contract.CancelReplyCancelled] == 0 {
		t.Error("no cancel answered cancelled: the test cancelled nothing pending")
	}
	for _, r := range []*replica{r0, r1} {
		if err := r.term(30 * time.Second); err != nil {
			t.Error(err)
		}
	}
}

// promValue returns the value of the sample named exactly series (name and
// labels) in a Prometheus text exposition; 0 if absent.
func promValue(text, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.TrimSpace(m[1]), 64)
	return v
}
