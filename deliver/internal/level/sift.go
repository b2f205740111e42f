package level

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/delayd/delayd/deliver/internal/ownership"
)

// Sifted is a level owner's answer to "which of these sequences of my
// stream are still pending?" (the list API's question,
// docs/pending.md#13-the-walk-top-k-by-final-due-with-a-per-stream-lower-bound):
// every sequence at or below Passed was handed off (delivered, forwarded
// or skipped as cancelled); Gone holds the ones asked above it that carry
// a tombstone (cancelled). The rest were pending when the owner looked (a
// cancel still in flight counts as pending, as status says).
type Sifted struct {
	Passed uint64   `json:"passed"`
	Gone   []uint64 `json:"gone,omitempty"`
}

// Pending reports whether seq was pending when the owner sifted it.
func (f Sifted) Pending(seq uint64) bool { return seq > f.Passed && !slices.Contains(f.Gone, seq) }

// siftNow is the owner's answer for seqs once its term's load has loaded
// the offset and the tombstones; false before, or once the owner no
// longer owns the level. Read-only: it reads the cancel book and the
// published passed, without the loop's turn (any goroutine).
//
// The tombstones are looked at before passed is read: a tombstone the
// janitor deleted between the two was at or below the acknowledged offset,
// so at or below the passed read after it. The other order would let a
// cancelled sequence skipped and retired in between pass as pending.
func (s *owner) siftNow(seqs []uint64) (Sifted, bool) {
	if !s.view.ready.done() || !s.owns() {
		return Sifted{}, false
	}
	var gone []uint64
	for _, seq := range seqs {
		if s.cancel.book.cancelled(seq) {
			gone = append(gone, seq)
		}
	}
	f := Sifted{Passed: s.view.passed.Load()}
	for _, seq := range gone {
		if seq > f.Passed {
			f.Gone = append(f.Gone, seq)
		}
	}
	return f, s.owns()
}

// sift is siftNow after waiting for the term's load, at most
// [DecidePendingWait]; an error wrapping [ownership.ErrNotOwner] without
// an answer.
func (s *owner) sift(ctx context.Context, seqs []uint64) (Sifted, error) {
	t := time.NewTimer(DecidePendingWait)
	defer t.Stop()
	select {
	case <-s.view.ready.wait():
	case <-s.done:
	case <-t.C:
	case <-ctx.Done():
		return Sifted{}, ctx.Err()
	}
	if f, ok := s.siftNow(seqs); ok {
		return f, nil
	}
	return Sifted{}, fmt.Errorf("level stream %s: %w (not loaded, or its term ended)", s.cfg.Stream, ownership.ErrNotOwner)
}

// Sift has the owner of stream sift seqs ([Sifted]): this replica's owner
// while a term runs here, else the owner over the level's decide subject.
// While no replica answers as the owner it asks again, as [Owners.Decide]
// does, for up to twice the lease TTL, then errs (never a guess: an
// answer of nothing passed would list delivered messages). A stream this
// replica does not know answers an error.
func (w *Owners) Sift(ctx context.Context, stream string, seqs []uint64) (Sifted, error) {
	l := w.levels[stream]
	if l == nil {
		return Sifted{}, fmt.Errorf("level stream %s: not a level of this replica", stream)
	}
	deadline := time.Now().Add(2 * w.leaseTTL)
	pause := 10 * time.Millisecond
	for {
		var (
			f   Sifted
			err error
		)
		if l.Owned() {
			if f, err = (local{l}).Sift(ctx, stream, seqs); !errors.Is(err, ownership.ErrNotOwner) {
				return f, err
			}
		} else if f, err = w.remote.Sift(ctx, stream, seqs); !errors.Is(err, ErrNoOwner) {
			return f, err
		}
		if ctx.Err() != nil {
			return Sifted{}, ctx.Err()
		}
		if time.Now().After(deadline) {
			return Sifted{}, fmt.Errorf("level stream %s has no owner answering now (its lease is changing hands: %v); send the request again", stream, err)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return Sifted{}, err
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// Streams returns the level streams this replica knows (partitions
// included), sorted by name.
func (w *Owners) Streams() []string {
	out := make([]string, 0, len(w.levels))
	for s := range w.levels {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Sift is the current owner's sift ([owner.sift]: it waits for the term's
// load up to [DecidePendingWait]); an error wrapping
// [ownership.ErrNotOwner] without an owner here.
func (a local) Sift(ctx context.Context, _ string, seqs []uint64) (Sifted, error) {
	o := a.l.slot.get()
	if o == nil {
		return Sifted{}, fmt.Errorf("level stream %s: %w", a.l.cfg.Stream, ownership.ErrNotOwner)
	}
	return o.sift(ctx, seqs)
}

// Sift asks the owner of stream on another replica ([decideOpSift]); an
// error wrapping [ErrNoOwner] when none answers as the owner.
func (p *remote) Sift(ctx context.Context, stream string, seqs []uint64) (Sifted, error) {
	body, err := askOwner(ctx, p.nc, stream, decideRequest{Op: decideOpSift, Seqs: seqs}, decideCancelWait)
	if err != nil {
		return Sifted{}, err
	}
	var f Sifted
	if err := json.Unmarshal([]byte(body), &f); err != nil {
		return Sifted{}, fmt.Errorf("owner of level stream %s: unexpected sift reply %s", stream, clip([]byte(body), 64))
	}
	return f, nil
}

// serveSift answers a sift request on the decide subscription's goroutine
// (no I/O): "not owner" until the term's load has loaded.
func (d *decideServer) serveSift(req decideRequest) string {
	f, ok := d.o.siftNow(req.Seqs)
	if !ok {
		return decideNotOwner
	}
	b, _ := json.Marshal(f) // cannot fail: numbers
	return string(b)
}
