package lease

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayd/delayd/internal/natstest"
)

// holdLoop acquires l, waits for the term to end, and again, until ctx
// ends; it records every term, ended or current, in terms.
type holdLoop struct {
	mu    sync.Mutex
	terms []TermInfo
}

func (h *holdLoop) run(ctx context.Context, l *Lease) {
	for ctx.Err() == nil {
		if err := l.Acquire(ctx); err != nil {
			return
		}
		select {
		case <-l.Context().Done():
		case <-ctx.Done():
		}
		h.mu.Lock()
		h.terms = append(h.terms, l.LastTerm())
		h.mu.Unlock()
	}
}

// TestClusterR3BucketLeaderLoss: on a 3-node cluster with an R3 lease
// bucket, two replicas (connected to different nodes) contend for one
// lease while the node leading the bucket shuts down. Afterwards one of
// them holds the lease again; terms never overlap, and epochs strictly
// increase in the order terms began.
//
// Which outcome happens depends on how long the bucket has no leader: a
// renewal sent then goes unanswered, so if the election outlasts
// TTL - margin after the last stored renewal, the holder's term expires
// and the lease is re-acquired (by either replica) at a higher epoch;
// otherwise the holder's term survives. The test logs which happened.
func TestClusterR3BucketLeaderLoss(t *testing.T) {
	// How long, from the leader's stop, for the election and a term that
	// began after it (or the first term renewed for 2 T): a liveness bound.
	const afterStopTimeout = 40 * time.Second
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	// ctx bounds the setup; the part after the leader stops (an
	// election, then a term) has its own bound, counted from the stop.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	bucket := "KV_" + BucketName
	var ls []*Lease
	for i, holder := range []string{"A", "B"} {
		_, js := c.Connect(i)
		b, err := OpenBucket(ctx, js, BucketConfig{Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, newLease(t, b, "router", holder, TTLDefault, 0))
	}
	acquire(t, ls[0], 10*time.Second)
	first := ls[0].LastTerm()

	loops := make([]*holdLoop, 2)
	loopCtx, stopLoops := context.WithCancel(context.Background())
	defer stopLoops()
	var wg sync.WaitGroup
	for i, l := range ls {
		loops[i] = &holdLoop{}
		wg.Go(func() { loops[i].run(loopCtx, l) })
	}

	leader := c.WaitStreamLeader(bucket)
	stopped := time.Now()
	afterStop := stopped.Add(afterStopTimeout)
	c.Stop(leader)
	newLeader := c.WaitStreamLeader(bucket)
	t.Logf("bucket leader node %d stopped; node %d leads after %s", leader, newLeader, time.Since(stopped).Round(time.Millisecond))

	// Wait until a term that began after the stop is valid, or the first
	// term has been renewed after the stop for 2 T.
	survived := false
	for {
		if ti := ls[0].LastTerm(); ti.Epoch == first.Epoch && !ti.Ended && ti.ValidUntil.Sub(stopped) > 2*TTLDefault {
			survived = true
			break
		}
		held := false
		for _, l := range ls {
			if ti := l.LastTerm(); !ti.Ended && ti.Acquired.After(stopped) && time.Now().Before(ti.ValidUntil) {
				held = true
			}
		}
		if held {
			break
		}
		if time.Now().After(afterStop) {
			t.Fatalf("nobody holds the lease %s after the bucket leader stopped: A %+v, B %+v", afterStopTimeout, ls[0].LastTerm(), ls[1].LastTerm())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopLoops()
	wg.Wait()

	terms := []TermInfo{first}
	for i, h := range loops {
		for _, ti := range h.terms {
			if ti.Acquired.Equal(first.Acquired) {
				terms[0] = ti // the first term, as it ended
				continue
			}
			terms = append(terms, ti)
		}
		_ = i
	}
	slices.SortFunc(terms, func(a, b TermInfo) int { return a.Acquired.Compare(b.Acquired) })
	for i := 1; i < len(terms); i++ {
		prev, next := terms[i-1], terms[i]
		if !prev.ValidUntil.Before(next.Acquired) || next.Epoch <= prev.Epoch {
			t.Fatalf("term %d %+v and term %d %+v overlap or do not increase the epoch", i-1, prev, i, next)
		}
	}
	if survived {
		t.Logf("the holder's term survived the bucket leader's shutdown at epoch %d", first.Epoch)
	} else {
		t.Logf("the holder's term ended (%v); re-acquired at epochs %v", terms[0].Cause, epochsOf(terms[1:]))
	}
}

func epochsOf(ts []TermInfo) []uint64 {
	var es []uint64
	for _, t := range ts {
		es = append(es, t.Epoch)
	}
	return es
}
