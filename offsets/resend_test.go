package offsets_test

import (
	"errors"
	"testing"

	"github.com/delayd/delayd/offsets"
)

// TestResentCommitRecognised: a fenced commit whose first copy was applied
// but whose answer was lost (held in a hung node's socket) is sent again;
// the copy sent again fails its compare-and-set on the first copy's
// revision, reads the key back, finds its own write id and counts the
// commit as done: not fenced, the value stored once, and the next commit
// is a compare-and-set at the first copy's revision
// (docs/design.md#re-sent-writes-to-a-hung-leader). Seen to fail with the
// read-back removed: the commit ended as fenced.
func TestResentCommitRecognised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newReplica(t, b.nc.ConnectedUrl())
	r.c.ResetAt(0, 0)
	if err := r.commit(t, 10); err != nil {
		t.Fatal(err)
	}
	offsets.LoseAnswers(r.c, func(n uint64) bool { return n == 2 }) // the first copy of the commit of 12
	if err := r.commit(t, 12); err != nil {
		t.Fatalf("commit whose first copy's answer was lost: %v; want its own write recognised", err)
	}
	e := b.raw(t, "DELAYD_5S")
	if r.c.Fenced() || r.c.Stored() != 12 || string(e.Value()) != "12" || r.c.Revision() != e.Revision() {
		t.Fatalf("after the re-sent commit: fenced %v, acked %d, revision %d; stored %q at %d; want not fenced, 12 at the stored revision",
			r.c.Fenced(), r.c.Stored(), r.c.Revision(), e.Value(), e.Revision())
	}
	if err := r.commit(t, 14); err != nil {
		t.Fatalf("the next commit: %v", err)
	}
	// One message per commit in the bucket's stream (10, 12, 14): the
	// re-sent copy of 12 was not stored. (A watch may skip values under
	// load; the stream's last sequence counts every write.)
	st, err := b.js.Stream(ctx(t), "KV_"+offsets.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if last := st.CachedInfo().State.LastSeq; last != 3 {
		t.Fatalf("bucket stream's last sequence %d, want 3: one write per commit, the re-sent one stored once", last)
	}
}

// TestResentCommitOtherOwner: a commit whose first copy was applied, its
// answer lost, and the key then bumped by a new owner (who writes the same
// value back) is fenced when its copy sent again fails the
// compare-and-set: the key's last entry has the same value but not this
// write's id, so it is not taken for its own. The new owner's offset
// stands. (A check by value alone would take the bump for its own write
// and let the old owner overwrite the new owner's next offset.)
func TestResentCommitOtherOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.nc.ConnectedUrl()
	old, next := newReplica(t, url), newReplica(t, url)
	old.c.ResetAt(0, 0)
	if err := old.commit(t, 10); err != nil {
		t.Fatal(err)
	}
	var bumpErr error
	var bumped, bumpRev uint64
	offsets.LoseAnswers(old.c, func(n uint64) bool {
		if n != 2 {
			return false
		}
		bumped, bumpRev, bumpErr = next.store.Bump(ctx(t), "DELAYD_5S") // reads 12, the lost copy's
		return true
	})
	err := old.commit(t, 12)
	if bumpErr != nil || bumped != 12 {
		t.Fatalf("new owner's bump: %d, %v; want 12", bumped, bumpErr)
	}
	if !errors.Is(err, offsets.ErrFenced) || !old.c.Fenced() {
		t.Fatalf("old owner's re-sent commit after the bump = %v (fenced %v); want ErrFenced", err, old.c.Fenced())
	}
	next.c.ResetAt(bumped, bumpRev)
	if err := next.commit(t, 15); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
	if e := b.raw(t, "DELAYD_5S"); string(e.Value()) != "15" {
		t.Fatalf("stored %q, want the new owner's 15", e.Value())
	}
}

// TestResentBumpRecognised: a new owner's bump whose first copy was applied
// but whose answer was lost (held in a hung node's socket) is sent again,
// as a fenced commit is: the copy sent again fails its compare-and-set on
// the first copy's revision, reads the key back and finds its own write
// id. The bump returns the offset at the first copy's revision (not
// ErrFenced, which would end the new owner's term), the bucket stores it
// once, and the old owner's next commit is fenced. Seen to fail with the
// bump sent once: it returned the lost answer's timeout.
func TestResentBumpRecognised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.nc.ConnectedUrl()
	old, next := newReplica(t, url), newReplica(t, url)
	old.c.ResetAt(0, 0)
	if err := old.commit(t, 10); err != nil {
		t.Fatal(err)
	}
	var lost int
	offsets.LoseBumpAnswers(next.store, func(n uint64) bool {
		if n == 1 {
			lost++
			return true
		}
		return false
	})
	off, rev, err := next.store.Bump(ctx(t), "DELAYD_5S")
	if err != nil || lost != 1 {
		t.Fatalf("bump whose first copy's answer was lost (lost %d): %v; want its own write recognised", lost, err)
	}
	e := b.raw(t, "DELAYD_5S")
	if off != 10 || rev != e.Revision() || string(e.Value()) != "10" {
		t.Fatalf("bump = %d at revision %d; stored %q at %d; want 10 at the stored revision", off, rev, e.Value(), e.Revision())
	}
	st, err := b.js.Stream(ctx(t), "KV_"+offsets.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if last := st.CachedInfo().State.LastSeq; last != 2 {
		t.Fatalf("bucket stream's last sequence %d, want 2: the commit and the bump, stored once", last)
	}
	if err := old.commit(t, 12); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("old owner's commit after the bump = %v; want ErrFenced", err)
	}
	next.c.ResetAt(off, rev)
	if err := next.commit(t, 12); err != nil {
		t.Fatalf("new owner's commit at the bump's revision: %v", err)
	}
}
