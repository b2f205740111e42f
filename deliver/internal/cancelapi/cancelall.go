package cancelapi

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
)

// The cancel-all API's limits (docs/pending.md#3-cancel-all-for-a-target).
const (
	// cancelAllQueueMax is how many cancel-all requests wait for the
	// cancel-all worker at most; one more is answered busy (429) at once.
	cancelAllQueueMax = 8
	// cancelAllBudget bounds one request's work from its arrival: past it
	// the answer says complete false, with what was decided.
	cancelAllBudget = 20 * time.Second
	// cancelAllPage is the page size of a cancel-all's walks.
	cancelAllPage = contract.PendingLimitMax
)

// errBadCancelAll wraps a cancel-all request's errors that are the
// request's fault (code 400).
var errBadCancelAll = errors.New("bad cancel-all request")

// enqueueCancelAll queues a cancel-all request for its worker, or answers
// it busy at once when cancelAllQueueMax wait already (counted in counts).
// It runs on the subscription's goroutine.
func enqueueCancelAll(ch chan queued, counts *RequestCounts, m *nats.Msg) {
	select {
	case ch <- queued{m: m, at: time.Now()}:
	default:
		counts.count(level.ErrCancelBusy)
		_ = m.RespondMsg(listErrorMsg(level.ErrCancelBusy))
	}
}

// runCancelAlls starts the one cancel-all worker on wg, with reader (its
// own), until ctx is done: one cancel-all runs at a time per replica.
func (a *API) runCancelAlls(ctx context.Context, wg *sync.WaitGroup, reader *jswire.BatchReader) {
	w, cancelAlls := &worker{a.env}, a.cancelAlls // the goroutine's
	wg.Go(func() {
		defer reader.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case q := <-cancelAlls:
				w.serveCancelAll(ctx, reader, q)
			}
		}
	})
}

// serveCancelAll answers one cancel-all request: a
// [contract.CancelAllReply] as JSON with [contract.CancelAllStatusOK], or
// an error answer with the cancel API's codes.
func (a *worker) serveCancelAll(ctx context.Context, reader *jswire.BatchReader, q queued) {
	m := q.m
	target := strings.TrimPrefix(m.Subject, contract.CancelAllSubject+".")
	reply, err := a.CancelAll(ctx, reader, target, m.Data, q.at.Add(cancelAllBudget))
	if err != nil && ctx.Err() != nil {
		return
	}
	a.cfg.CancelAlls.count(err)
	if err != nil {
		if !errors.Is(err, errBadCancelAll) && !errors.Is(err, level.ErrCancelBusy) {
			a.logger.Warn("cancel-all failed", slog.String("target", target), slog.Int("cancelled", reply.Cancelled), slog.Any("error", err))
		}
		_ = m.RespondMsg(listErrorMsg(err))
		return
	}
	data, _ := json.Marshal(reply) // cannot fail: numbers and a bool
	_ = m.RespondMsg(&nats.Msg{Data: data, Header: nats.Header{contract.HeaderStatus: {strconv.Itoa(contract.CancelAllStatusOK)}}})
}

// CancelAll cancels every message pending for target that was published
// before the request, with payload data (empty, or the JSON object {}),
// reading with reader; its work stops at deadline with Complete false.
//
// The cut: the ingress stream's last sequence in the routed wait's first
// stream info after the request arrived ([routedAsk.waitBound]). A level
// message whose first ingress sequence (Delayd-Origin, else
// Delayd-Ingress) in the ingress stream's present life is above the cut
// was published after the request, and is not touched; one of an earlier
// life was published before.
//
// Each message is decided by its level's owner on the placement the walk
// read, as a cancel's is ([Decider].Decide, the owner's reserve and
// tombstone): "cancelled" only when the owner says so, so delivered xor
// cancelled holds per message. The target's pages are walked again until
// a walk decides nothing: a message that hopped to another level meanwhile
// (forwarded) is found at its new placement by the next walk.
//
// An error of the request's own making wraps errBadCancelAll (code 400).
// Another error comes with the counts decided before it.
func (a *worker) CancelAll(ctx context.Context, reader *jswire.BatchReader, target string, data []byte, deadline time.Time) (contract.CancelAllReply, error) {
	var reply contract.CancelAllReply
	if err := contract.ValidateTarget(target, cmp.Or(a.cfg.Prefix, contract.PrefixDefault)); err != nil {
		return reply, fmt.Errorf("%w: %w", errBadCancelAll, err)
	}
	if strings.TrimSpace(string(data)) != "" {
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		var none struct{}
		if err := dec.Decode(&none); err != nil {
			return reply, fmt.Errorf("%w: payload is not empty or {}: %w", errBadCancelAll, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*cancelWaitRouted+cancelAllBudget)
	defer cancel()
	life, err := a.ingressLife(ctx)
	if err != nil {
		return reply, err
	}
	cut, caughtUp, err := a.routed.waitBound(ctx)
	switch {
	case err != nil:
		return reply, err
	case !caughtUp:
		return reply, ErrRouterBehind
	}
	if a.cfg.Hooks.CancelAllCut != nil {
		a.cfg.Hooks.CancelAllCut(cut)
	}
	for {
		decided, err := a.cancelAllWalk(ctx, reader, target, life, cut, deadline, &reply)
		switch {
		case errors.Is(err, errBudgetSpent) || (errors.Is(err, level.ErrCancelBusy) && reply.Cancelled+reply.AlreadyDelivered > 0):
			return reply, nil // Complete false
		case err != nil:
			return reply, err
		case decided == 0:
			reply.Complete = true
			return reply, nil
		}
	}
}

// errBudgetSpent ends a cancel-all whose deadline passed.
var errBudgetSpent = errors.New("cancel-all budget spent")

// cancelAllWalk walks every page of target's pending messages once and
// has each one published before cut decided, counting the answers in
// reply. It returns how many it had decided.
func (a *worker) cancelAllWalk(ctx context.Context, reader *jswire.BatchReader, target, life string, cut uint64, deadline time.Time, reply *contract.CancelAllReply) (int, error) {
	decided := 0
	q := listQuery{target: target, limit: cancelAllPage}
	for {
		page, cands, err := a.walkPage(ctx, reader, q, deadline)
		if err != nil {
			return decided, err
		}
		for _, c := range cands {
			if !beforeCut(c.ref, life, cut) {
				continue // published after the request
			}
			if time.Now().After(deadline) {
				return decided, errBudgetSpent
			}
			rec := index.Record{Key: c.key, Stream: c.item.Stream, Seq: c.item.Seq, Hop: c.hop, Due: c.item.Due, Target: target}
			answer, err := a.cfg.Decider.Decide(ctx, reader, rec, level.Ask{Op: level.AskCancel})
			if err != nil {
				return decided, err
			}
			decided++
			switch answer {
			case level.AnswerCancelled:
				reply.Cancelled++
			case level.AnswerDelivered:
				reply.AlreadyDelivered++
			}
			// AnswerForwarded, AnswerRetry: the next walk finds it where
			// it is; AnswerGone: not the message read there.
		}
		if page.Next == "" {
			return decided, nil
		}
		b, err := base64.RawURLEncoding.DecodeString(page.Next)
		if err == nil {
			err = json.Unmarshal(b, &q.cur)
		}
		if err != nil {
			return decided, fmt.Errorf("the list's own cursor: %w", err)
		}
	}
}

// beforeCut reports whether a level message whose first ingress
// reference is ref was published before the cut: its ingress sequence is
// at or below cut in the ingress stream's present life, or it is of an
// earlier life. A message without a reference (none is written so) is
// taken as before.
func beforeCut(ref, life string, cut uint64) bool {
	refLife, seq, ok := message.ParseIngressRef(ref)
	return !ok || refLife != life || seq <= cut
}
