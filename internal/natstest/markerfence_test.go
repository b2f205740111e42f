package natstest_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// TestExpectedMarkerSeqPipelined records why delayd's router does not
// fence its level writes by the marker subject's last sequence
// (Nats-Expected-Last-Subject-Sequence with
// Nats-Expected-Last-Subject-Sequence-Subject, next to
// Nats-Expected-Last-Sequence; docs/design.md#re-sent-writes-to-a-hung-leader).
// nats-server v2.15.2 takes both headers together and checks both: a
// standalone server stores a pipelined burst of such writes and refuses
// one naming an older marker. But the leader of a replicated stream
// refuses (10164) a write expecting a subject's last sequence while
// another write expecting that subject is proposed and not yet applied
// (jetstream_batching.go, "If the subject is already in process"): of a
// pipelined burst, each expecting the marker subject, only the writes the
// stream applied before the next one arrived are stored; the router's
// pipeline would refuse itself. When this test fails, the server changed:
// the fence may then be reconsidered.
func TestExpectedMarkerSeqPipelined(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	const n = 20
	burst := func(t *testing.T, js jetstream.JetStream, replicas int) (stored int, inProcess int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PIPE", Subjects: []string{"pipe.>"}, Replicas: replicas}); err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, "pipe.marker", nil)
		if err != nil {
			t.Fatal(err)
		}
		marker := strconv.FormatUint(ack.Sequence, 10)
		futures := make([]jetstream.PubAckFuture, n)
		for i := range futures {
			m := &nats.Msg{Subject: "pipe.m", Header: nats.Header{}, Data: []byte{byte(i)}}
			m.Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(ack.Sequence+uint64(i), 10))
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, marker)
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "pipe.marker")
			if futures[i], err = js.PublishMsgAsync(m); err != nil {
				t.Fatal(err)
			}
		}
		var apiErr *jetstream.APIError
		for i, f := range futures {
			select {
			case <-f.Ok():
				stored++
			case err := <-f.Err():
				if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant {
					inProcess++
				}
				if i < 3 {
					t.Logf("write %d (R%d): %v", i, replicas, err)
				}
			case <-ctx.Done():
				t.Fatalf("write %d unanswered", i)
			}
		}
		return stored, inProcess
	}

	t.Run("standalone", func(t *testing.T) {
		srv := natstest.Start(t, nil)
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		if stored, _ := burst(t, js, 1); stored != n {
			t.Fatalf("standalone: %d of %d pipelined writes stored; want all", stored, n)
		}
		// A newer marker: a write at the right last sequence naming the
		// older marker is refused.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ack, err := js.Publish(ctx, "pipe.marker", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = js.Publish(ctx, "pipe.m", nil, jetstream.WithExpectLastSequence(ack.Sequence),
			jetstream.WithExpectLastSequenceForSubject(1, "pipe.marker"))
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			t.Fatalf("write naming the older marker: %v; want the refusal 10071", err)
		}
	})

	t.Run("replicated", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		_, js := c.Connect(0)
		stored, inProcess := burst(t, js, 3)
		t.Logf("R3: %d of %d pipelined writes stored, %d refused as in process", stored, n, inProcess)
		if stored == n || inProcess == 0 {
			t.Fatalf("R3: %d of %d pipelined writes stored, %d refused as in process (10164); want refusals. The server changed: see the comment", stored, n, inProcess)
		}
	})
}

// TestAtomicMarkerBatchFencesHeldWrites records the fence
// docs/design.md#re-sent-writes-to-a-hung-leader proposes for a stale
// router's pipelined level writes: a new term's marker written as one
// atomic batch of w messages, the first expecting the tail t read, moves
// the stream's last sequence from t to t+w in one step, so a stale
// writer's writes held past it, expecting t .. t+w-1 (at most w in flight
// past what it confirmed), are all refused, in whatever order they come;
// the new term's own write expecting t+w is stored. On a standalone server
// and on a replicated stream (the leader checks the batch's expected last
// sequence before it proposes it).
func TestAtomicMarkerBatchFencesHeldWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	const w = 4
	fence := func(t *testing.T, nc *nats.Conn, js jetstream.JetStream, replicas int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAD", Subjects: []string{"pad.>"}, Replicas: replicas, AllowAtomicPublish: true}); err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, "pad.m", []byte("stored before"))
		if err != nil {
			t.Fatal(err)
		}
		tail := ack.Sequence
		for i := 1; i <= w; i++ { // the marker batch
			m := &nats.Msg{Subject: "pad.marker", Header: nats.Header{}}
			m.Header.Set("Nats-Batch-Id", "term-6")
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i))
			if i == 1 {
				m.Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(tail, 10))
			}
			if i < w {
				if err := nc.PublishMsg(m); err != nil {
					t.Fatal(err)
				}
				continue
			}
			m.Header.Set("Nats-Batch-Commit", "1")
			if ack, err = js.PublishMsg(ctx, m); err != nil {
				t.Fatalf("marker batch: %v", err)
			}
		}
		if ack.Sequence != tail+w {
			t.Fatalf("marker batch ends at %d; want %d", ack.Sequence, tail+w)
		}
		var apiErr *jetstream.APIError
		for _, e := range []uint64{tail + 1, tail + w - 1, tail} { // held writes of the older term, any order
			_, err := js.Publish(ctx, "pad.m", []byte("held"), jetstream.WithExpectLastSequence(e))
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				t.Fatalf("R%d: held write expecting %d after the marker batch (%d..%d): %v; want the refusal 10071", replicas, e, tail+1, tail+w, err)
			}
		}
		if _, err := js.Publish(ctx, "pad.m", []byte("new term"), jetstream.WithExpectLastSequence(tail+w)); err != nil {
			t.Fatalf("R%d: the new term's write: %v", replicas, err)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		srv := natstest.Start(t, nil)
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		fence(t, nc, js, 1)
	})
	t.Run("replicated", func(t *testing.T) {
		c := natstest.StartCluster(t, 3)
		nc, js := c.Connect(0)
		fence(t, nc, js, 3)
	})
}
