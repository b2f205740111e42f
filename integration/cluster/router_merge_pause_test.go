//go:build long && unix

package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestRouterPausedInMergeCheck stops the router lease's holder x (SIGSTOP)
// at a point between its lease check and its level write, where
// [TestClusterRouterPaused]'s stops at random instants do not land: in
// the merge check of a message m2 whose merge key's first message m1 is
// pending in a level owned by the other replica, y. x asks y (the level's
// decide subject) and waits up to 0.5 s for the answer; y is stopped
// first, so x is still waiting when it is stopped in turn. y is continued,
// takes the router lease (writing its epoch markers), and merges m2 into
// m1 (its own scanner has m1 pending). Then x is continued: its wait ran
// out ("not pending"), and it sends m2's level write expecting the level
// stream's tail as it synced it. The epoch marker y wrote moved that tail,
// so the write is refused: the level stream never holds m2, a message y
// merged. Without the markers the write is stored (y wrote nothing to the
// level), and m2 would be delivered although merged.
func TestRouterPausedInMergeCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("runs delayd processes and stops them: skipped under testing.Short()")
	}
	t.Parallel()
	srv := natstest.Start(t, nil)
	// Levels long enough that m1 is still pending when y decides.
	env := []string{"DELAYD_REPLICAS=1", "DELAYD_LEVELS=20s 40s"}
	r0 := startReplica(t, "r0", srv.ClientURL(), env...)
	r0.waitReady(time.Minute)
	r1 := startReplica(t, "r1", srv.ClientURL(), env...)
	r1.waitReady(time.Minute)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := &itest.Bundle{T: t, NC: nc, JS: js}

	held := func(r *replica, key string) bool { return metricValue(t, r, `delayd_lease_held{lease="`+key+`"}`) == 1 }
	// settled: both count two live replicas and hold no more than their
	// share (the hand-overs are done, nothing moves).
	settled := func() bool {
		for _, r := range []*replica{r0, r1} {
			code, body, err := r.get("/metrics")
			if err != nil || code != 200 || !strings.Contains(body, "delayd_replicas_live 2\n") {
				return false
			}
			n := 0
			for line := range strings.Lines(body) {
				if strings.HasPrefix(line, "delayd_lease_held{") && strings.HasSuffix(strings.TrimSpace(line), " 1") {
					n++
				}
			}
			if share := metricValue(t, r, "delayd_lease_share"); share <= 0 || float64(n) > share {
				return false
			}
		}
		return true
	}
	b.CreateStream("PM", "pm.>")
	levelHolds := func(stream, payload string) bool {
		for _, m := range b.StreamMsgs(stream) {
			if string(m.Data) == payload {
				return true
			}
		}
		return false
	}
	// One attempt sets the scene: x is stopped while it waits on y for
	// m2's merge check. x's wait is 0.5 s (a production constant), and
	// this test sees m2 delivered and stops x from outside: on a loaded
	// machine that can take longer, x then writes m2 before it stops, and
	// the attempt is spoiled (it says nothing either way). Such an
	// attempt is undone (both continued, left to settle again) and made
	// again with a new merge key and payloads; each attempt's messages
	// are told apart by their payloads.
	var x, y *replica
	var stream, m1, m2 string
	var mergedBefore float64
	attempt := func(n int) bool {
		var lvl int
		itest.WaitFor(t, time.Minute, "the replicas settled, the router and a level of the table in different ones", func() bool {
			if !settled() {
				return false
			}
			x, y = r0, r1
			if held(r1, "router") {
				x, y = r1, r0
			}
			if !held(x, "router") {
				return false
			}
			for i, s := range []string{"DELAYD_20S", "DELAYD_40S"} {
				if held(y, "level."+s) && !held(x, "level."+s) {
					lvl, stream = i+1, s
					return true
				}
			}
			return false
		})
		t.Logf("attempt %d: %s holds the router lease, %s the level stream %s", n, x.name, y.name, stream)
		key := "order-" + strconv.Itoa(n)
		m1, m2 = "m1-"+strconv.Itoa(n), "m2-"+strconv.Itoa(n)
		h := func() nats.Header {
			return nats.Header{contract.HeaderLevel: {strconv.Itoa(lvl)}, contract.HeaderMergeKey: {key}}
		}
		routed, merged := -1.0, -1.0 // -1: not read yet (metricValue's "no answer")
		itest.WaitFor(t, 10*time.Second, "the counters before the attempt", func() bool {
			routed, merged = metricValue(t, x, "delayd_routed_total"), metricValue(t, y, "delayd_merged_total")
			return routed >= 0 && merged >= 0
		})
		mergedBefore = merged
		b.Publish("delay.pm.close", []byte(m1), h())
		itest.WaitFor(t, time.Minute, x.name+" to route "+m1, func() bool { return metricValue(t, x, "delayd_routed_total") >= routed+1 })

		// x's ingress consumer is its term's: delayd-router-<epoch>.
		consumer := deliver.RouterConsumerName(uint64(metricValue(t, x, `delayd_lease_epoch{lease="router"}`)))
		ackPending := func() int {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := js.Consumer(ctx, deliver.IngressStream, consumer)
			if err != nil {
				return -1
			}
			info, err := c.Info(ctx)
			if err != nil {
				return -1
			}
			return info.NumAckPending
		}
		y.pause()
		b.Publish("delay.pm.close", []byte(m2), h())
		// Delivered to x and not acked: x is in m2's merge check, waiting
		// for y's answer (0.5 s).
		itest.WaitFor(t, 10*time.Second, m2+" delivered to "+x.name, func() bool { return ackPending() == 1 })
		x.pause()
		if levelHolds(stream, m2) || ackPending() != 1 {
			t.Logf("attempt %d: %s wrote %s before it stopped (its merge check's wait ran out first): undone, made again", n, x.name, m2)
			y.resume()
			x.resume()
			return false
		}
		return true
	}
	for n := 1; !attempt(n); n++ {
		if n == 3 {
			t.Fatalf("in %d attempts %s always wrote m2 before it stopped: this machine cannot set the scene", n, x.name)
		}
	}

	y.resume()
	itest.WaitFor(t, time.Minute, y.name+" to take the router lease and merge "+m2, func() bool {
		return held(y, "router") && metricValue(t, y, "delayd_merged_total") >= mergedBefore+1
	})
	continued := time.Now()
	x.resume()
	itest.WaitFor(t, time.Minute, x.name+" to give up the router lease", func() bool { return metricValue(t, x, `delayd_lease_held{lease="router"}`) == 0 })
	// x sends m2's write as soon as it runs again (its wait is over): the
	// level stream stays unchanged from then on, with or without it.
	itest.WaitQuiet(t, 2*time.Second, time.Minute, func() int { return len(b.StreamMsgs(stream)) })
	for _, e := range x.log.events() {
		if !e.logged.Before(continued) && (strings.Contains(e.msg, "router") || strings.Contains(e.msg, "level write")) {
			t.Logf("%s after it was continued: %q (error %s)", x.name, e.msg, e.attr("error"))
		}
	}
	if _, body, err := x.get("/metrics"); err == nil {
		for line := range strings.Lines(body) {
			if strings.HasPrefix(line, "delayd_fenced_writes_total{") && strings.Contains(line, fmt.Sprintf("stream=%q", stream)) {
				t.Logf("%s: %s", x.name, strings.TrimSpace(line))
			}
		}
	}
	if levelHolds(stream, m2) {
		t.Errorf("%s holds %s, which %s merged: the stale router %s wrote it after the newer term began", stream, m2, y.name, x.name)
	}
	if !levelHolds(stream, m1) {
		t.Errorf("%s does not hold %s", stream, m1)
	}
	if got := metricValue(t, y, "delayd_merged_total") - mergedBefore; got != 1 {
		t.Errorf("%s merged %v messages, want 1 (%s)", y.name, got, m2)
	}
}
