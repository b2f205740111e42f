package level

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// TestLeaderlessStreamInfo checks the server behaviour the scanner's
// leaderless guard rests on: a member of an R3 stream's group that has no
// leader (here the other two nodes are stopped) answers a stream info with
// its own state, which may lag the stream's, and names no leader; the
// leader's info names it; a standalone server's names itself. A scanner
// on that member decides nothing from its info: its start returns
// errLeaderless, and sameStream does not take it for a recreated stream.
// A scanner that took the lagging last sequence for the stream's would
// "correct" its offset backwards (seen in the multi-replica tests as
// "offsets moved back").
func TestLeaderlessStreamInfo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster and stops two nodes; skipped under testing.Short()")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := natstest.StartCluster(t, 3)
	_, js := c.Connect(0)
	const stream = "DELAYD_5S" // a level stream name, for the scanner
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"lag.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func(js jetstream.JetStream, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "lag.x", Data: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(js, 0, 5)
	leader := c.WaitStreamLeader(stream)
	member := (leader + 1) % c.Len()
	if s, err := js.Stream(ctx, stream); err != nil || leaderless(s.CachedInfo()) || s.CachedInfo().State.LastSeq != 5 {
		t.Fatalf("with a leader: %v, want its info naming it, last sequence 5", err)
	}
	// A member answers for a leaderless group only once its JetStream ran
	// for nats-server's startup threshold (10 s): until then it is silent.
	time.Sleep(11 * time.Second)
	// The leader may have moved during the wait (elections are CPU-bound
	// under load): the member is a node that does not lead it now.
	leader = c.WaitStreamLeader(stream)
	member = (leader + 1) % c.Len()
	nc, err := nats.Connect(c.URL(member))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	njs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A scanner of the stream on the member, made while the cluster runs.
	store, err := offsets.New(ctx, js, offsets.Config{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	lvl, err := NewForTest(nc, njs, Config{Stream: stream, Offsets: store, Targets: target.New(nc, njs, nil)})
	if err != nil {
		t.Fatal(err)
	}
	scanner := newOwner(lvl, ownership.Term{})
	// The third node stops first and the leader last. Stopped the other
	// way, the member and the third node were left with no leader and a
	// quorum, and elected one, the member in half the cases, which then
	// names itself for up to nats-server's lost-quorum interval once alone:
	// under load a slow shutdown outlasted the election timeout, and the
	// member answered leaderless=false.
	for i := range c.Len() {
		if i != member && i != leader {
			c.Stop(i)
		}
	}
	c.Stop(leader)
	// ctx bounds the cluster's setup; what follows the stops (the
	// member's step-down, its answer, the scanner's refusals) has its own
	// bound, counted from the last stop.
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	// The leader may still have moved to the member since it was read:
	// this test is about a member with no leader, so wait until the member
	// does not lead the stream (it steps down once it sees its quorum lost).
	for sctx.Err() == nil && c.Server(member).JetStreamIsStreamLeader(natstest.Account, stream) {
		time.Sleep(100 * time.Millisecond)
	}
	var info *jetstream.StreamInfo
	var lone jetstream.Stream
	for sctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(sctx, 2*time.Second)
		s, err := njs.Stream(rctx, stream)
		rcancel()
		if err == nil {
			info, lone = s.CachedInfo(), s
			break
		}
		t.Logf("stream info from the lone member: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
	if info == nil {
		t.Fatal("the lone member never answered a stream info")
	}
	if !leaderless(info) || info.State.LastSeq != 5 {
		t.Fatalf("the lone member: leaderless=%v last=%d, want true and its own state, 5 (cluster %+v)", leaderless(info), info.State.LastSeq, info.Cluster)
	}

	// The scanner decides nothing from it: its start is refused
	// (errLeaderless, retried), and sameStream does not take it for a
	// recreated stream, though its creation time is not the one the
	// scanner started on (a leader's info would read as recreated).
	for sctx.Err() == nil {
		err := scanner.load(sctx)
		if errors.Is(err, errLeaderless) {
			break
		}
		if err == nil || !strings.HasPrefix(err.Error(), "level stream: ") || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			t.Fatalf("scanner start on the lone member: %v, want %v", err, errLeaderless)
		}
		t.Logf("scanner start on the lone member: %v", err)
	}
	if sctx.Err() != nil {
		t.Fatalf("the scanner's start on the lone member not refused with %v within 60 s of the stops", errLeaderless)
	}
	scanner.life.stream, scanner.life.created = lone, info.Created.Add(-time.Hour)
	for range 3 {
		if !scanner.sameStream(sctx) || scanner.pos.reload {
			t.Fatalf("sameStream on the lone member's info: the scanner reloads (reload %v), want no decision", scanner.pos.reload)
		}
	}

	// A standalone server names itself as the leader.
	_, sjs := natstest.Connect(t)
	ss, err := sjs.CreateStream(sctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"lag.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if leaderless(ss.CachedInfo()) {
		t.Fatalf("standalone: leaderless, cluster %+v", ss.CachedInfo().Cluster)
	}
}
