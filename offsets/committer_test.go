package offsets_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/offsets"
)

func newCommitter(t *testing.T, b *testBundle, from uint64) *offsets.Committer {
	t.Helper()
	c, err := offsets.NewCommitter(b.store, offsets.CommitterConfig{Stream: "DELAYD_5S", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c.Reset(from)
	if c.Committed() != from || c.Stored() != from {
		t.Fatalf("after Reset(%d): committed %d, stored %d", from, c.Committed(), c.Stored())
	}
	return c
}

// TestCommitterForward: commits only move forward. A lower offset is
// refused with ErrRegress and changes neither the committer nor the bucket;
// the same offset again writes nothing.
func TestCommitterForward(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newCommitter(t, b, 10)
	if err := c.Commit(ctx(t), 12); err != nil {
		t.Fatal(err)
	}
	if err := c.Await(ctx(t)); err != nil {
		t.Fatalf("Await: %v", err)
	}
	e := b.raw(t, "DELAYD_5S")
	if string(e.Value()) != "12" || c.Stored() != 12 || c.Committed() != 12 {
		t.Fatalf("after Commit(12): bucket %q, stored %d, committed %d; want 12 each", e.Value(), c.Stored(), c.Committed())
	}
	if c.Revision() != e.Revision() {
		t.Errorf("Revision() = %d, want the bucket's %d", c.Revision(), e.Revision())
	}
	for _, seq := range []uint64{11, 0} {
		if err := c.Commit(ctx(t), seq); !errors.Is(err, offsets.ErrRegress) {
			t.Fatalf("Commit(%d) after 12 = %v, want ErrRegress", seq, err)
		}
	}
	if err := c.Commit(ctx(t), 12); err != nil {
		t.Fatalf("Commit of the same offset: %v", err)
	}
	if err := c.Await(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := b.raw(t, "DELAYD_5S"); string(got.Value()) != "12" || got.Revision() != e.Revision() || c.Committed() != 12 || c.Stored() != 12 {
		t.Fatalf("after refused regressions and a repeat: bucket %q at revision %d (was %d), committed %d, stored %d; want 12, unchanged, 12, 12",
			got.Value(), got.Revision(), e.Revision(), c.Committed(), c.Stored())
	}
}

// TestCommitterOneInFlight: one offset write is in flight at a time, an
// offset counts as acknowledged only once its PubAck arrived, and offsets
// committed meanwhile are coalesced into one write of the latest.
//
// To hold a PubAck, the bucket's stream is deleted and a core subscriber
// on the real server takes the key's subject in its place, answering each
// write with a PubAck only when the test says so.
func TestCommitterOneInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newCommitter(t, b, 10)
	if err := b.js.DeleteStream(ctx(t), "KV_"+offsets.Bucket); err != nil {
		t.Fatal(err)
	}
	sub, err := b.nc.SubscribeSync("$KV." + offsets.Bucket + ".DELAYD_5S")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	next := func() *nats.Msg {
		t.Helper()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no offset write arrived: %v", err)
		}
		return m
	}
	ack := func(m *nats.Msg, rev uint64) {
		t.Helper()
		if err := m.Respond(fmt.Appendf(nil, `{"stream":"KV_%s","seq":%d}`, offsets.Bucket, rev)); err != nil {
			t.Fatal(err)
		}
	}

	if err := c.Commit(ctx(t), 11); err != nil {
		t.Fatal(err)
	}
	first := next()
	if string(first.Data) != "11" {
		t.Fatalf("first write %q, want 11", first.Data)
	}
	// 11 is in flight, unanswered: not acknowledged. Later offsets wait.
	for _, seq := range []uint64{12, 13} {
		if err := c.Commit(ctx(t), seq); err != nil {
			t.Fatal(err)
		}
	}
	if c.Stored() != 10 || c.Committed() != 13 {
		t.Fatalf("with 11 in flight: stored %d, committed %d; want 10 and 13", c.Stored(), c.Committed())
	}
	ack(first, 41)
	// The next write is the latest offset: 12 was never written, so it
	// was not sent while 11 was in flight.
	second := next()
	if string(second.Data) != "13" {
		t.Fatalf("write after 11 was answered: %q, want 13 (12 coalesced into it)", second.Data)
	}
	if a := c.Stored(); a != 11 {
		t.Fatalf("with 13 in flight after 11 was acknowledged: stored %d, want 11", a)
	}
	if c.Revision() != 41 {
		t.Fatalf("Revision() = %d, want 41 (the PubAck of 11)", c.Revision())
	}
	ack(second, 42)
	if err := c.Await(ctx(t)); err != nil {
		t.Fatalf("Await: %v", err)
	}
	if c.Stored() != 13 || c.Revision() != 42 {
		t.Fatalf("after 13 was acknowledged: stored %d, revision %d; want 13 and 42", c.Stored(), c.Revision())
	}
	if m, err := sub.NextMsg(0); err == nil {
		t.Fatalf("an extra offset write %q after everything was acknowledged", m.Data)
	}
}

// TestCommitterFailedWrite: a write the bucket refuses (its stream's
// message size limit) is reported by Await and not acknowledged; the next
// offset supersedes it and is acknowledged once stored.
func TestCommitterFailedWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 10); err != nil {
		t.Fatal(err)
	}
	c := newCommitter(t, b, 10)
	limit := func(size int32) {
		t.Helper()
		st, err := b.js.Stream(ctx(t), "KV_"+offsets.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxMsgSize = size
		if _, err := b.js.UpdateStream(ctx(t), cfg); err != nil {
			t.Fatal(err)
		}
	}
	limit(1) // every offset write is refused
	if err := c.Commit(ctx(t), 11); err != nil {
		t.Fatal(err)
	}
	err := c.Await(ctx(t))
	if err == nil || !strings.Contains(err.Error(), "DELAYD_5S=11") {
		t.Fatalf("Await after a refused write = %v; want the write's error naming DELAYD_5S=11", err)
	}
	if c.Stored() != 10 || c.Committed() != 11 {
		t.Fatalf("after a refused write: stored %d, committed %d; want 10 and 11", c.Stored(), c.Committed())
	}
	if got := b.raw(t, "DELAYD_5S"); string(got.Value()) != "10" {
		t.Fatalf("bucket holds %q after a refused write, want 10", got.Value())
	}

	limit(-1)
	if err := c.Commit(ctx(t), 12); err != nil {
		t.Fatal(err)
	}
	if err := c.Await(ctx(t)); err != nil {
		t.Fatalf("Await after the limit was lifted: %v", err)
	}
	if got := b.raw(t, "DELAYD_5S"); string(got.Value()) != "12" || c.Stored() != 12 {
		t.Fatalf("after the next commit: bucket %q, stored %d; want 12 and 12", got.Value(), c.Stored())
	}
}
