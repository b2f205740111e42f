package cancelapi

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// DecideID finds the message id names in scope and has its level's owner
// decide it: cancel it (status false), or only tell (status true). The
// answer is AnswerCancelled, AnswerDelivered, AnswerGone (not found) or,
// for a status request, AnswerPending with the message's due time (its
// delivery, not a cascade hop). An id the index no longer knows answers
// from its kept answer ([API.keptAnswer]).
//
// The owner's AnswerDelivered is checked against the index, read again
// up to its leader's last record ([index.LookupLatest]): the owner also
// finds a message it skipped as cancelled below its next sequence with no
// tombstone once the janitor deleted that (after storing its "cancelled"
// record), so a request whose first lookup came before that record would
// otherwise answer "already delivered" after another was answered
// "cancelled" (docs/guarantees.md#delivered-xor-cancelled). A record newer
// than the one decided is decided instead.
func (a *worker) DecideID(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time, status bool) (level.CancelAnswer, time.Time, error) {
	ask := level.Ask{Op: level.AskCancel}
	if status {
		ask.Op = level.AskStatus
	}
	return a.decideID(ctx, reader, id, scope, notAfter, func(time.Time) (level.Ask, error) { return ask, nil })
}

// decideID is [worker.DecideID] for the question askAt returns, given the
// request's time by the server's clock once the router caught up (the
// routed wait's; [routedAsk.waitNow]): a reschedule's new due is
// computed from it. An error from askAt is the request's answer. A
// reschedule's AnswerRescheduled comes with the Ask's Due.
func (a *worker) decideID(ctx context.Context, reader *jswire.BatchReader, id, scope string, notAfter time.Time, askAt func(now time.Time) (level.Ask, error)) (level.CancelAnswer, time.Time, error) {
	id = strings.TrimSpace(id)
	keys, err := a.idKeys(ctx, id)
	if err != nil {
		return 0, time.Time{}, err
	}
	if len(keys) == 0 {
		return level.AnswerGone, time.Time{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*cancelWaitRouted)
	defer cancel()
	// A message published before this request is in the ingress stream at
	// or below its last sequence; once the router has acked everything up
	// to there, its index record is readable.
	now, caughtUp, err := a.routed.waitNow(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	if !caughtUp {
		now = time.Now() // the router is behind: this process's clock
	}
	ask, err := askAt(now)
	if err != nil {
		return 0, time.Time{}, err
	}
	rec, ok, err := a.lookupAll(ctx, reader, id, keys, scope, notAfter)
	if err != nil {
		return 0, time.Time{}, err
	}
	if !ok {
		// Trimmed from the index: its final answer, if kept.
		kept, found, err := a.keptAnswer(ctx, keys, scope, id)
		switch {
		case err != nil:
			return 0, time.Time{}, err
		case found && kept.Cancelled:
			return level.AnswerCancelled, time.Time{}, nil
		case found:
			return level.AnswerDelivered, time.Time{}, nil
		case !caughtUp:
			return 0, time.Time{}, ErrRouterBehind
		}
	}
	if a.cfg.Hooks.Looked != nil {
		a.cfg.Hooks.Looked(rec)
	}
	return a.decideLoop(ctx, reader, rec, ok, scope, notAfter, ask)
}

// lookupAll looks up each of id's index keys and returns the one record in
// scope, ok false if none is; two in scope are ambiguous ([ErrAmbiguousID]).
func (a *worker) lookupAll(ctx context.Context, reader *jswire.BatchReader, id string, keys []string, scope string, notAfter time.Time) (index.Record, bool, error) {
	var (
		rec index.Record
		ok  bool
	)
	for _, key := range keys {
		r, found, err := index.LookupPaced(ctx, reader, key, jswire.OpTimeout, a.lookups.pace(notAfter))
		if err != nil {
			return index.Record{}, false, err
		}
		if found {
			if found, err = a.inScope(ctx, reader, r, scope); err != nil {
				return index.Record{}, false, err
			}
		}
		if found && ok {
			return index.Record{}, false, ambiguous(id)
		}
		if found {
			rec, ok = r, true
		}
	}
	return rec, ok, nil
}

// decideLoop has rec's level owner decide ask (ok false: no record in
// scope, AnswerGone), looking it up again while it is between two levels
// (forwarded, or its level write not stored yet) until the router placed
// it or cancelWaitRouted passed ([ErrRouterBehind]). An AnswerDelivered is
// checked against the index's latest record, as [API.DecideID] says.
func (a *worker) decideLoop(ctx context.Context, reader *jswire.BatchReader, rec index.Record, ok bool, scope string, notAfter time.Time, ask level.Ask) (level.CancelAnswer, time.Time, error) {
	var (
		seen uint64
		err  error
	)
	deadline := time.Now().Add(cancelWaitRouted)
	pause := 2 * time.Millisecond
	for {
		if ok && rec.Gone {
			return level.AnswerCancelled, time.Time{}, nil // cancelled before
		}
		if !ok || rec.Stream == "" {
			return level.AnswerGone, time.Time{}, nil
		}
		if rec.At > seen {
			answer, err := a.cfg.Decider.Decide(ctx, reader, rec, ask)
			if err != nil {
				return 0, time.Time{}, err
			}
			switch answer {
			case level.AnswerDelivered:
				// The owner found the sequence below its next one with no
				// tombstone: handed off, or skipped as cancelled with its
				// tombstone deleted since the lookup (the janitor deletes
				// it once the offset passed it, after it stored the
				// "cancelled" record). A record newer than rec answers.
				newer, found, err := index.LookupLatest(ctx, a.readConn(), reader, rec.Key, jswire.OpTimeout, a.lookups.pace(time.Time{}))
				if err != nil {
					return 0, time.Time{}, err
				}
				if !found || newer.At <= rec.At {
					return level.AnswerDelivered, time.Time{}, nil
				}
				if ok, err = a.inScope(ctx, reader, newer, scope); err != nil {
					return 0, time.Time{}, err
				}
				rec = newer
				continue
			case level.AnswerCancelled, level.AnswerGone:
				return answer, time.Time{}, nil
			case level.AnswerPending:
				return answer, rec.Due, nil
			case level.AnswerRescheduled:
				return answer, ask.Due, nil
			case level.AnswerForwarded:
				seen = rec.At
			case level.AnswerRetry: // the level write is not stored yet: ask again
			}
		}
		// Between two levels: wait for the router to place it.
		if time.Now().After(deadline) {
			return 0, time.Time{}, ErrRouterBehind
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return 0, time.Time{}, err
		}
		pause = min(2*pause, 100*time.Millisecond)
		if rec, ok, err = index.LookupPaced(ctx, reader, rec.Key, jswire.OpTimeout, a.lookups.pace(notAfter)); err != nil {
			return 0, time.Time{}, err
		}
		if ok {
			if ok, err = a.inScope(ctx, reader, rec, scope); err != nil {
				return 0, time.Time{}, err
			}
		}
	}
}

// inScope reports whether rec's message has the target scope; every
// message is in the unscoped form's scope "". A record without a target
// (written before records carried it) is checked against the level message
// it places; one that placed none (left delayd) is out of any scope.
func (a *worker) inScope(ctx context.Context, reader *jswire.BatchReader, rec index.Record, scope string) (bool, error) {
	switch {
	case scope == "":
		return true, nil
	case rec.Target != "":
		return rec.Target == scope, nil
	case rec.Stream == "":
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	msgs, err := reader.Read(rctx, rec.Stream, nil, rec.Seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(msgs) == 0 || msgs[0].Header.Get(message.HdrJSSequence) != strconv.FormatUint(rec.Seq, 10) || message.LevelKey(msgs[0].Header) != rec.Key {
		return false, nil
	}
	return msgs[0].Header.Get(message.HdrJSSubject) == contract.LevelSubjectPrefix+strings.TrimPrefix(rec.Stream, levels.StreamPrefix)+"."+scope, nil
}
