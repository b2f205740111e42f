package deliver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// TestLeaderlessStreamInfo checks the server behaviour the scanner's
// leaderless guard rests on: a member of an R3 stream's group that has no
// leader (here the other two nodes are stopped) answers a stream info with
// its own state, which may lag the stream's, and names no leader; the
// leader's info names it; a standalone server's names itself.
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
	const stream = "DELAYD_LAG"
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
	nc, err := nats.Connect(c.URL(member))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	njs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Len() {
		if i != member {
			c.Stop(i)
		}
	}
	var info *jetstream.StreamInfo
	for ctx.Err() == nil {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := njs.Stream(rctx, stream)
		rcancel()
		if err == nil {
			info = s.CachedInfo()
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

	// A standalone server names itself as the leader.
	_, sjs := natstest.Connect(t)
	ss, err := sjs.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"lag.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if leaderless(ss.CachedInfo()) {
		t.Fatalf("standalone: leaderless, cluster %+v", ss.CachedInfo().Cluster)
	}
}
