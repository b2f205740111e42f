package cancelapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
)

// The reschedule API (docs/pending.md#21-the-decision): a request to
// delayd.api.reschedule.<target> ([contract.RescheduleSubjectFor]) or the
// operator's delayd.api.reschedule, with the id as its payload and exactly
// one delay header, shares the cancel API's queue, workers, paced lookups
// and busy answer, and its path to the owner ([worker.DecideID]'s), asking
// [level.AskReschedule] with the new due.

// RescheduleCounts counts the reschedule API's answers by kind. Safe for
// concurrent use; a nil *RescheduleCounts counts nothing.
type RescheduleCounts struct {
	// Rescheduled, NotFound and Delivered count the three answers (200,
	// 404, 409); BadRequest requests refused as sent (400), Busy those
	// answered 429, Failed the other errors (500, 503).
	Rescheduled, NotFound, Delivered, BadRequest, Busy, Failed atomic.Uint64
}

// count counts one answer.
func (c *RescheduleCounts) count(answer level.CancelAnswer, err error) {
	switch {
	case c == nil:
	case errors.As(err, new(badReschedule)), errors.Is(err, ErrAmbiguousID):
		c.BadRequest.Add(1)
	case errors.Is(err, level.ErrCancelBusy):
		c.Busy.Add(1)
	case err != nil:
		c.Failed.Add(1)
	case answer == level.AnswerRescheduled:
		c.Rescheduled.Add(1)
	case answer == level.AnswerDelivered:
		c.Delivered.Add(1)
	default:
		c.NotFound.Add(1)
	}
}

// badReschedule is a reschedule request's error of its own making (code
// 400): its text is the error's, so a delay refused reads as the router's
// dead letter for the same header would ("invalid delay level: …").
type badReschedule struct{ error }

func (e badReschedule) Unwrap() error { return e.error }

// isRescheduleSubject reports whether subject is the reschedule API's,
// unscoped ([contract.RescheduleSubject]) or scoped
// ("delayd.api.reschedule.<target>").
func isRescheduleSubject(subject string) bool {
	return subject == contract.RescheduleSubject || strings.HasPrefix(subject, contract.RescheduleSubject+".")
}

// serveReschedule answers one reschedule request on a cancel worker with
// its reader.
func (a *worker) serveReschedule(ctx context.Context, reader *jswire.BatchReader, q queued) {
	m := q.m
	// The scoped form's target; "" for the unscoped form.
	scope, scoped := strings.CutPrefix(m.Subject, contract.RescheduleSubject+".")
	if !scoped {
		scope = ""
	}
	answer, due, err := level.AnswerGone, time.Time{}, error(nil)
	if !scoped || scope != "" {
		answer, due, err = a.Reschedule(ctx, reader, string(m.Data), m.Header, scope, q.at.Add(QueueWait))
	}
	if err != nil && ctx.Err() != nil {
		return
	}
	a.cfg.Reschedules.count(answer, err)
	_ = m.RespondMsg(rescheduleReplyMsg(answer, due, err))
	if err != nil && !errors.Is(err, level.ErrCancelBusy) && !errors.As(err, new(badReschedule)) {
		a.logger.Warn("reschedule failed", slog.String("id", string(m.Data)), slog.Any("error", err))
	}
}

// Reschedule decides one reschedule request: the message id names in
// scope (as [worker.Cancel] finds it) is moved to the due its delay headers h
// ask for. It returns AnswerRescheduled with the new due,
// AnswerDelivered, or AnswerGone (not found; a cancelled message too:
// nothing is pending under its id).
//
// h holds exactly one of Delay-Level, Delay-Duration and Delay-Deliver-At
// with one value, by the router's rules ([message.ParseDelay]); the new
// due is computed from now, the server's time once the router caught up
// ([routedAsk.waitNow]): now plus the level's delay or the duration, or
// the Delay-Deliver-At time; a due at or before now is "run now" (the new
// due is now). A due beyond DELAYD_MAX_DELAY from now is refused. A
// request's own errors (code 400) are badReschedule.
func (a *worker) Reschedule(ctx context.Context, reader *jswire.BatchReader, id string, h nats.Header, scope string, notAfter time.Time) (level.CancelAnswer, time.Time, error) {
	d, err := message.ParseDelay(h, a.cfg.Levels)
	if err != nil {
		if d.Header == contract.HeaderLevel {
			// The level table's errors do not name the header.
			err = fmt.Errorf("%s: %w", contract.HeaderLevel, err)
		}
		return 0, time.Time{}, badReschedule{err}
	}
	maxDelay := cmp.Or(a.cfg.MaxDelay, contract.MaxDelayDefault)
	answer, due, err := a.decideID(ctx, reader, id, scope, notAfter, func(now time.Time) (level.Ask, error) {
		due, err := rescheduleDue(d, now, maxDelay)
		return level.Ask{Op: level.AskReschedule, Due: due}, err
	})
	if answer == level.AnswerCancelled {
		answer = level.AnswerGone
	}
	return answer, due, err
}

// rescheduleDue is the new due delay d asks for, requested at now (the
// server's time): now plus the level's delay or the duration, or the
// Delay-Deliver-At time, and now itself for a due at or before now (run
// now). A due beyond maxDelay from now is a badReschedule.
func rescheduleDue(d message.Delay, now time.Time, maxDelay time.Duration) (time.Time, error) {
	if err := d.CheckMax(now, maxDelay); err != nil {
		return time.Time{}, badReschedule{err}
	}
	if due := d.Due(now); due.After(now) {
		return due, nil
	}
	return now, nil // run now
}

// rescheduleReplyMsg builds the reschedule API's reply: the cancel API's
// texts and codes (replyMsg), 400 for a request's own error, and
// [contract.RescheduleReplyRescheduled] with its code and the new due in
// Delay-Due-At.
func rescheduleReplyMsg(answer level.CancelAnswer, due time.Time, err error) *nats.Msg {
	switch {
	case errors.Is(err, level.ErrCancelBusy):
		err = level.ErrCancelBusy // the answer's text, not the path to it
		return replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
	case errors.As(err, new(badReschedule)):
		m := replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
		m.Header.Set(contract.HeaderStatus, strconv.Itoa(contract.CancelStatusBadRequest))
		return m
	case err != nil:
		return replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
	case answer == level.AnswerRescheduled:
		return &nats.Msg{
			Data: []byte(contract.RescheduleReplyRescheduled),
			Header: nats.Header{
				contract.HeaderStatus: {strconv.Itoa(contract.RescheduleStatusRescheduled)},
				contract.HeaderDueAt:  {contract.FormatTime(due)},
			},
		}
	case answer == level.AnswerDelivered:
		return replyMsg(contract.CancelReplyDelivered, nil)
	}
	return replyMsg(contract.CancelReplyNotFound, nil)
}
