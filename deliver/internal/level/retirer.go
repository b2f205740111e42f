package level

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// retirer deletes the cancel tombstones the owner's loop hands it
// ([owner.dropTombstones], through the level's retire queue), off the
// loop. Before a tombstone goes, its message's "cancelled" index records
// must be written (unless a later placement of the same id is the latest
// record by now), so a later cancel still answers cancelled. An owner's
// run starts one and stops it before it returns; its fields are set by
// startRetirer and only read after, and its one goroutine does the work.
type retirer struct {
	lvl  *Level             // the queue, the book, the stream's name, the connection
	stop context.CancelFunc // ends run
	done chan struct{}      // closed when run has returned
}

// startRetirer starts a retirer for l on a goroutine of its own, until
// ctx is done or stop is called.
func startRetirer(ctx context.Context, l *Level) *retirer {
	ctx, cancel := context.WithCancel(ctx)
	r := &retirer{lvl: l, stop: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); r.run(ctx) }()
	return r
}

// Stop stops the retirer and waits for its goroutine. A tombstone being
// deleted is deleted first (its own timeout); the rest stay queued.
func (r *retirer) Stop() {
	r.stop()
	<-r.done
}

// run deletes the tombstones the queue holds until ctx is done.
func (r *retirer) run(ctx context.Context) {
	l := r.lvl
	reader, err := jswire.NewBatchReader(l.deps.nc, index.Batch)
	if err != nil {
		l.logger.Error("cancel tombstone janitor", slog.Any("error", err))
		return
	}
	defer reader.Close()
	for {
		var t retiree
		select {
		case <-ctx.Done():
			return
		case t = <-l.cancel.retire:
		}
		jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jswire.OpTimeout)
		err := r.retire(jctx, reader, t)
		cancel()
		l.cancel.book.retired(t.t.Seq, err == nil)
		if err != nil {
			l.logger.Warn("cancel tombstone not deleted; retrying later", slog.Uint64("seq", t.t.Seq), slog.Any("error", err))
		}
	}
}

// retire writes rt's missing index records and deletes the tombstone. A
// move's intent has none to write (its new placement, if any, is the
// latest record; docs/pending.md#23-the-book-and-the-loop): it and its
// placed mark are deleted.
func (r *retirer) retire(ctx context.Context, reader *jswire.BatchReader, rt retiree) error {
	l := r.lvl
	t := rt.t
	if !rt.indexed && !rt.move {
		for _, key := range []string{t.Key, t.MergeKey} {
			if key == "" {
				continue
			}
			latest, ok, err := index.Lookup(ctx, reader, key, jswire.OpTimeout)
			if err != nil {
				return err
			}
			if ok && !latest.Gone && (latest.Stream != l.cfg.Stream || latest.Seq != t.Seq) {
				continue // the id or key was placed again since: that placement is not cancelled
			}
			if !ok || !latest.Gone {
				target := t.Target // known if cancelled by this process, else the placement's
				if target == "" {
					target = latest.Target
				}
				if _, err := l.deps.js.PublishMsg(ctx, index.Record{Key: key, Gone: true, Target: target}.Msg()); err != nil {
					return err
				}
			}
		}
		l.cancel.book.markIndexed(t.Seq)
	}
	from := rt.from
	if from == nil {
		// The handing owner had no tombstones stream: its load set a
		// position, then failed to look the stream up (which leaves
		// io.tombstones nil, a reload's too), and the owner's shutdown
		// dropped what the acknowledged offset passed anyway. A load
		// that never set a position drops nothing (owner.shutdown).
		var err error
		if from, err = jswire.StreamInfo(ctx, l.deps.js, index.CancelStream); err != nil {
			return err
		}
	}
	for _, at := range []uint64{t.At, rt.markAt} {
		if at == 0 {
			continue // a move whose mark is not known; a mark whose intent is gone
		}
		if err := from.DeleteMsg(ctx, at); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
	}
	return nil
}
