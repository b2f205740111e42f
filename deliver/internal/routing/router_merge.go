package routing

import (
	"cmp"
	"context"
	"strconv"
	"strings"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// mergeInto reports whether a message with merge key key for target has a
// pending first message to be merged into: one written in this session and
// not yet confirmed, or one the index places in a level stream that has not
// handed it to its target yet. A lookup that fails merges nothing and
// returns its error: the message is then delivered on its own, never lost.
func (r *Router) mergeInto(ctx context.Context, target, key string) (bool, error) {
	if r.deps.Owners == nil {
		return false, nil
	}
	k := index.MergeKey(target, key)
	rec, inFlight, ok := r.merges.lookupFlight(k)
	if !ok {
		ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		defer cancel()
		var err error
		rec, ok, err = index.Lookup(ctx, r.run.ids, k, jswire.OpTimeout)
		if err == nil && ok && rec.Stream != "" && !rec.Gone {
			ok, err = r.placed(ctx, rec, target, key)
		}
		if err != nil {
			return false, err
		}
	}
	if !ok || rec.Stream == "" || rec.Gone {
		return false, nil
	}
	pending := r.deps.Owners.Pending(ctx, rec)
	if err := ctx.Err(); err != nil {
		// Stopped while asking: no answer is not "not pending" here; the
		// message stays unacked for the next session (as a lookup stopped by
		// ctx leaves it).
		return false, err
	}
	if pending && rec.Hop && !inFlight {
		// The owner counts a cascading placement it passed as pending
		// until its due time (forwarded to its next level), and so it
		// counts one it skipped as cancelled once the janitor deleted its
		// tombstone: that cancel may have been decided in another replica,
		// so this cache was not told. The janitor stored the merge key's
		// "cancelled" record before, so the index, read up to its
		// leader's last record, tells (docs/guarantees.md#delivered-xor-cancelled).
		// (A placement in flight has no record yet: the index's latest
		// is an older message's.)
		latest, found, err := index.LookupLatest(ctx, cmp.Or(r.deps.LookupConn, r.deps.js.Conn()), r.run.ids, k, jswire.OpTimeout, nil)
		if err != nil {
			return false, err
		}
		if found && latest.Gone {
			r.merges.forget(latest)
			return false, nil
		}
	}
	return pending, nil
}

// placed reports whether an index record of merge key key for target names
// a stored placement: the message at its sequence has that key and target.
// A record can outlive a level write that failed (it was written in the
// same group as other records, then delayd crashed): its sequence is then
// empty, or holds another message. A message that already hopped on
// (purged from the level) counts as placed: its record is the latest, so it
// has not been placed again yet.
func (r *Router) placed(ctx context.Context, rec index.Record, target, key string) (bool, error) {
	msgs, err := r.run.ids.Read(ctx, rec.Stream, nil, rec.Seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(msgs) == 0 || msgs[0].Header.Get(message.HdrJSSequence) != strconv.FormatUint(rec.Seq, 10) {
		if !rec.Hop || r.deps.Owners == nil {
			return false, nil
		}
		passed := r.deps.Owners.Passed(ctx, rec.Stream)
		if err := ctx.Err(); err != nil {
			return false, err // stopped while asking (see mergeInto)
		}
		return rec.Seq <= passed, nil
	}
	prefix := contract.LevelSubjectPrefix + strings.TrimPrefix(rec.Stream, levels.StreamPrefix) + "."
	subject := msgs[0].Header.Get(message.HdrJSSubject)
	return msgs[0].Header.Get(message.HdrMerge) == key && strings.HasPrefix(subject, prefix) && subject[len(prefix):] == target, nil
}
