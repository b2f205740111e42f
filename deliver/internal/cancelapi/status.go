package cancelapi

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
)

// serveStatus answers one status request (docs/guide.md#status-ask-without-cancelling), on a cancel
// worker with its reader: the request shares the cancel API's queue, its
// paced lookups and its busy answer. The level's owner decides, as for a
// cancel ([API.DecideID]), without reserving anything: a pending
// message stays pending. A pending answer carries the message's due time
// in Delay-Due-At.
func (a *worker) serveStatus(ctx context.Context, reader *jswire.BatchReader, q queued) {
	m := q.m
	// The scoped form's target; "" for the unscoped form.
	scope, scoped := strings.CutPrefix(m.Subject, contract.StatusSubject+".")
	if !scoped {
		scope = ""
	}
	var (
		answer = level.AnswerGone
		due    time.Time
		err    error
	)
	if !scoped || scope != "" {
		answer, due, err = a.DecideID(ctx, reader, string(m.Data), scope, q.at.Add(QueueWait), true)
	}
	if err != nil && ctx.Err() != nil {
		return
	}
	a.countStatus(answer, err)
	_ = m.RespondMsg(statusReplyMsg(answer, due, err))
	if err != nil && !errors.Is(err, level.ErrCancelBusy) {
		a.logger.Warn("status failed", slog.String("id", string(m.Data)), slog.Any("error", err))
	}
}

// isStatusSubject reports whether subject is the status API's, unscoped
// ([contract.StatusSubject]) or scoped ("delayd.api.status.<target>"),
// rather than the cancel API's: the two share the queue.
func isStatusSubject(subject string) bool {
	return subject == contract.StatusSubject || strings.HasPrefix(subject, contract.StatusSubject+".")
}

// countStatus counts a status answer by result, as [API.Cancel]
// counts a cancel's: busy, or the state told. An error answer other than
// busy is logged, not counted (nor is a cancel's).
func (a *worker) countStatus(answer level.CancelAnswer, err error) {
	switch {
	case errors.Is(err, level.ErrCancelBusy):
		a.cfg.Statuses.Busy.Add(1)
	case err != nil:
	case answer == level.AnswerPending:
		a.cfg.Statuses.Pending.Add(1)
	case answer == level.AnswerCancelled:
		a.cfg.Statuses.Cancelled.Add(1)
	case answer == level.AnswerDelivered:
		a.cfg.Statuses.Delivered.Add(1)
	default:
		a.cfg.Statuses.NotFound.Add(1)
	}
}

// statusReplyMsg builds the status API's reply: the answer's text and
// code, as the cancel API's (replyMsg), with [contract.StatusPending]
// and Delay-Due-At for a pending message.
func statusReplyMsg(answer level.CancelAnswer, due time.Time, err error) *nats.Msg {
	switch {
	case errors.Is(err, level.ErrCancelBusy):
		err = level.ErrCancelBusy // the answer's text, not the path to it
		return replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
	case err != nil:
		return replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
	case answer == level.AnswerPending:
		return &nats.Msg{
			Data: []byte(contract.StatusReplyPending),
			Header: nats.Header{
				contract.HeaderStatus: {strconv.Itoa(contract.StatusPending)},
				contract.HeaderDueAt:  {contract.FormatTime(due)},
			},
		}
	case answer == level.AnswerCancelled:
		return replyMsg(contract.CancelReplyCancelled, nil)
	case answer == level.AnswerDelivered:
		return replyMsg(contract.CancelReplyDelivered, nil)
	}
	return replyMsg(contract.CancelReplyNotFound, nil)
}
