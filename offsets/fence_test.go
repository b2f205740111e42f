package offsets_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// replica is one delayd replica's view of the offsets: its own
// connection, Store and fenced Committer for DELAYD_5S.
type replica struct {
	store *offsets.Store
	c     *offsets.Committer
}

func newReplica(t *testing.T, url string) *replica {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := offsets.New(ctx(t), js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := offsets.NewCommitter(store, offsets.CommitterConfig{Stream: "DELAYD_5S", Timeout: 5 * time.Second, Fenced: true})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{store: store, c: c}
}

// commit commits seq and waits for its write's outcome.
func (r *replica) commit(t *testing.T, seq uint64) error {
	t.Helper()
	if err := r.c.Commit(ctx(t), seq); err != nil {
		return err
	}
	return r.c.Await(ctx(t))
}

// valueLog records every value the offset key takes, in order.
type valueLog struct {
	mu     sync.Mutex
	values []uint64
}

func watchValues(t *testing.T, kv jetstream.KeyValue, key string) *valueLog {
	t.Helper()
	wctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := kv.Watch(wctx, key)
	if err != nil {
		t.Fatal(err)
	}
	l := &valueLog{}
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			v, err := strconv.ParseUint(string(e.Value()), 10, 64)
			if err != nil {
				continue
			}
			l.mu.Lock()
			l.values = append(l.values, v)
			l.mu.Unlock()
		}
	}()
	return l
}

// waitLen waits until n values were seen and returns them.
func (l *valueLog) waitLen(t *testing.T, n int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		vs := append([]uint64(nil), l.values...)
		l.mu.Unlock()
		if len(vs) >= n || time.Now().After(deadline) {
			return vs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFencedCommitAfterBump: a paused old owner's commit after a new
// owner's bump and commit fails with ErrFenced (wrapping the server's
// wrong-last-sequence error), and the stored value stays the new owner's.
// The fenced committer then refuses every further commit without writing,
// until reset. Under compare-and-set the offset key's values only move
// forward, though the old owner's offset is lower than the new owner's.
func TestFencedCommitAfterBump(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.nc.ConnectedUrl()
	seen := watchValues(t, b.kv, "DELAYD_5S")
	old, next := newReplica(t, url), newReplica(t, url)

	// The old owner starts on a key never written (revision 0: create).
	if _, rev, err := old.store.LoadRevision(ctx(t), "DELAYD_5S"); !errors.Is(err, offsets.ErrNotFound) || rev != 0 {
		t.Fatalf("LoadRevision of a missing key = revision %d, %v; want 0, ErrNotFound", rev, err)
	}
	old.c.ResetAt(0, 0)
	for _, seq := range []uint64{10, 12} {
		if err := old.commit(t, seq); err != nil {
			t.Fatalf("old owner's commit %d: %v", seq, err)
		}
	}

	// A new owner takes the level stream over and bumps the key.
	off, bumpRev, err := next.store.Bump(ctx(t), "DELAYD_5S")
	if err != nil || off != 12 || bumpRev <= old.c.Revision() {
		t.Fatalf("Bump = %d at revision %d, %v; want 12 at a revision after %d", off, bumpRev, err, old.c.Revision())
	}
	next.c.ResetAt(off, bumpRev)

	if err := next.commit(t, 15); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}

	// The old owner, paused until now, commits what it delivered before
	// the pause: a lower offset than the new owner's.
	err = old.commit(t, 13)
	if !errors.Is(err, offsets.ErrFenced) || !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("old owner's commit after the bump = %v; want ErrFenced wrapping the revision mismatch", err)
	}
	if !old.c.Fenced() || old.c.Stored() != 12 {
		t.Fatalf("old committer: fenced %v, stored %d; want true and 12", old.c.Fenced(), old.c.Stored())
	}
	// Once fenced, the old committer writes nothing, even a higher offset.
	if err := old.c.Commit(ctx(t), 20); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("old owner's commit once fenced = %v, want ErrFenced", err)
	}
	if err := old.c.Await(ctx(t)); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("old owner's Await once fenced = %v, want ErrFenced", err)
	}
	if e := b.raw(t, "DELAYD_5S"); string(e.Value()) != "15" || e.Revision() != next.c.Revision() {
		t.Fatalf("stored %q at revision %d; want the new owner's 15 at %d", e.Value(), e.Revision(), next.c.Revision())
	}

	// Every value the key took: 10, 12, 12 (bump), 15; never backwards.
	vs := seen.waitLen(t, 4)
	for i := 1; i < len(vs); i++ {
		if vs[i] < vs[i-1] {
			t.Fatalf("offset values %v move backwards", vs)
		}
	}
	// The watch may skip values under load (its ordered consumer restarts
	// at the key's latest revision, and the bucket keeps one), so the
	// last value seen must be the new owner's and the old owner's 13 must
	// never appear; that it never moves backwards is checked above.
	if len(vs) == 0 || vs[len(vs)-1] != 15 || slices.Contains(vs, 13) {
		t.Fatalf("offset values %v, want 10 12 12 15 (values may be skipped, never 13, last 15)", vs)
	}
}

// TestFencedCreateRace: with no offset stored yet, Bump reports
// ErrNotFound and writes nothing; of two owners that both start from
// "never written" (revision 0), only the first write is stored and the
// other fails with ErrFenced. A key deleted by hand is fenced from its
// delete marker's revision.
func TestFencedCreateRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.nc.ConnectedUrl()
	a, c := newReplica(t, url), newReplica(t, url)
	if _, rev, err := c.store.Bump(ctx(t), "DELAYD_5S"); !errors.Is(err, offsets.ErrNotFound) || rev != 0 {
		t.Fatalf("Bump of a missing key = revision %d, %v; want 0, ErrNotFound", rev, err)
	}
	a.c.ResetAt(0, 0)
	c.c.ResetAt(0, 0)
	if err := c.commit(t, 7); err != nil {
		t.Fatal(err)
	}
	if err := a.commit(t, 9); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("second creator's commit = %v, want ErrFenced", err)
	}
	if e := b.raw(t, "DELAYD_5S"); string(e.Value()) != "7" {
		t.Fatalf("stored %q, want the first creator's 7", e.Value())
	}

	if err := b.kv.Delete(ctx(t), "DELAYD_5S"); err != nil {
		t.Fatal(err)
	}
	_, marker, err := a.store.LoadRevision(ctx(t), "DELAYD_5S")
	if !errors.Is(err, offsets.ErrDeleted) || marker == 0 {
		t.Fatalf("LoadRevision of a deleted key = revision %d, %v; want the marker's, ErrDeleted", marker, err)
	}
	a.c.ResetAt(3, marker)
	if err := a.commit(t, 4); err != nil {
		t.Fatalf("commit at the delete marker's revision: %v", err)
	}
	if err := c.commit(t, 8); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("stale owner's commit after the delete and a new commit = %v, want ErrFenced", err)
	}
	if e := b.raw(t, "DELAYD_5S"); string(e.Value()) != "4" {
		t.Fatalf("stored %q, want 4", e.Value())
	}
}

// TestFencedCommitR3: on a 3-node cluster with an R3 offsets bucket (whose
// stream reports a failed compare-and-set with another error code than a
// single server), an old owner's commit after a new owner's bump still
// fails with ErrFenced, and the new owner's offset stays.
func TestFencedCommitR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	// An R3 bucket's creation waits for its stream's election: on a busy
	// machine that can take longer than ctx's 10 s.
	setup, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rs []*replica
	for i := range 2 {
		_, js := c.Connect(i)
		store, err := offsets.New(setup, js, offsets.Config{Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		cm, err := offsets.NewCommitter(store, offsets.CommitterConfig{Stream: "DELAYD_5S", Timeout: 5 * time.Second, Fenced: true})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, &replica{store: store, c: cm})
	}
	old, next := rs[0], rs[1]
	old.c.ResetAt(0, 0)
	if err := old.commit(t, 10); err != nil {
		t.Fatal(err)
	}
	off, rev, err := next.store.Bump(ctx(t), "DELAYD_5S")
	if err != nil || off != 10 {
		t.Fatalf("Bump = %d, %v; want 10", off, err)
	}
	next.c.ResetAt(off, rev)
	if err := next.commit(t, 15); err != nil {
		t.Fatal(err)
	}
	if err := old.commit(t, 12); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("old owner's commit after the bump on R3 = %v, want ErrFenced", err)
	}
	if got, err := next.store.Load(ctx(t), "DELAYD_5S"); err != nil || got != 15 {
		t.Fatalf("stored offset %d, %v; want the new owner's 15", got, err)
	}
}
