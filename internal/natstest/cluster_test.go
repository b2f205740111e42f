package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// TestClusterR3BucketSurvivesNode: on a 3-node cluster an R3 KV bucket is
// placed on every node, and after its leader's node shuts down a value
// written then is stored and read back, and a value written before is
// still there. After the node restarts, it holds both too.
func TestClusterR3BucketSurvivesNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	_, js := c.Connect(0)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "R3TEST", Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	info, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config().Replicas != 3 {
		t.Fatalf("bucket replicas %d, want 3", info.Config().Replicas)
	}
	if _, err := kv.Put(ctx, "k", []byte("before")); err != nil {
		t.Fatal(err)
	}

	leader := c.WaitStreamLeader("KV_R3TEST")
	c.Stop(leader)
	// A client on another node; the bucket elects a new leader among the
	// two left.
	// A request sent while no node leads the bucket goes unanswered, so
	// each attempt gets its own short timeout.
	_, js2 := c.Connect((leader + 1) % 3)
	var kv2 jetstream.KeyValue
	var rev uint64
	retry(ctx, t, "write after the bucket's leader stopped", func(ctx context.Context) (err error) {
		if kv2 == nil {
			if kv2, err = js2.KeyValue(ctx, "R3TEST"); err != nil {
				return err
			}
		}
		rev, err = kv2.Put(ctx, "k2", []byte("after"))
		return err
	})
	if nl := c.StreamLeader("KV_R3TEST"); nl == leader || nl < 0 {
		t.Fatalf("after node %d stopped and a write was stored, the leader is node %d", leader, nl)
	}
	// A bucket allows direct gets, which any replica answers, a follower
	// that has not applied the write yet too: read until it has.
	for key, want := range map[string]string{"k": "before", "k2": "after"} {
		retry(ctx, t, "read "+key+" after the leader stopped", func(ctx context.Context) error {
			e, err := kv2.Get(ctx, key)
			if err != nil {
				return err
			}
			if string(e.Value()) != want {
				return fmt.Errorf("get %s = %q, want %q", key, e.Value(), want)
			}
			return nil
		})
	}

	c.Restart(leader)
	srv := c.Server(leader)
	deadline := time.Now().Add(natstest.ClusterReadyTimeout)
	for !srv.JetStreamIsStreamCurrent(natstest.Account, "KV_R3TEST") {
		if time.Now().After(deadline) {
			t.Fatalf("restarted node %d never caught up on the bucket", leader)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Read the restarted node's own copy (direct get is served by any
	// replica; a connection to that node only asks it).
	// A bound of its own: the catch-up above may have spent most of the
	// first one on a loaded machine (CI under -race: 45 s ran out here).
	ctx, cancel = context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	_, js3 := c.Connect(leader)
	// Stream info is answered by the stream's leader, which may be moving
	// as the node rejoins: each attempt gets its own short timeout.
	var m *jetstream.RawStreamMsg
	retry(ctx, t, "read k2 from the restarted node", func(ctx context.Context) error {
		st, err := js3.Stream(ctx, "KV_R3TEST")
		if err != nil {
			return err
		}
		m, err = st.GetLastMsgForSubject(ctx, "$KV.R3TEST.k2")
		return err
	})
	if string(m.Data) != "after" || m.Sequence != rev {
		t.Fatalf("restarted node's bucket: k2 = %q at revision %d; want %q at revision %d", m.Data, m.Sequence, "after", rev)
	}
}

// retry calls f with a 2 s timeout until it returns nil, and fails the
// test with what when ctx ends first.
func retry(ctx context.Context, t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := f(actx)
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}
