package deliver

import "github.com/delayd/delayd/deliver/internal/cancelapi"

// CancelStats counts the cancel API's answers.
type CancelStats struct {
	Cancelled, NotFound, AlreadyDelivered uint64
	// Busy counts requests answered [ErrCancelBusy] without a look: they
	// arrived while [CancelQueueMax] waited.
	Busy uint64
}

// StatusStats counts the status API's answers
// (docs/guide.md#status-ask-without-cancelling), as [CancelStats] counts
// the cancel API's.
type StatusStats struct {
	Pending, Cancelled, NotFound, AlreadyDelivered uint64
	// Busy counts requests answered [ErrCancelBusy] without a look: they
	// arrived while [CancelQueueMax] waited.
	Busy uint64
}

// CancelStats returns the cancel API's answers since start.
func (s *Service) CancelStats() CancelStats {
	return CancelStats{Cancelled: s.answers.cancels.Cancelled.Load(), NotFound: s.answers.cancels.NotFound.Load(), AlreadyDelivered: s.answers.cancels.Delivered.Load(), Busy: s.answers.cancels.Busy.Load()}
}

// StatusStats returns the status API's answers since start.
func (s *Service) StatusStats() StatusStats {
	return StatusStats{Pending: s.answers.statuses.Pending.Load(), Cancelled: s.answers.statuses.Cancelled.Load(), NotFound: s.answers.statuses.NotFound.Load(),
		AlreadyDelivered: s.answers.statuses.Delivered.Load(), Busy: s.answers.statuses.Busy.Load()}
}

// RequestStats counts a request API's answers by result: the list API's
// ([Service.ListStats], docs/guide.md#pending-messages) and the cancel-all
// API's ([Service.CancelAllStats]).
type RequestStats struct {
	// OK counts answers with code 200 (a page; a cancel-all's counts,
	// complete or not).
	OK uint64
	// BadRequest counts requests refused as sent (400).
	BadRequest uint64
	// Busy counts requests answered [ErrCancelBusy] (429): their queue was
	// full, or their paced reads would have waited too long.
	Busy uint64
	// Failed counts the other error answers (500, 503).
	Failed uint64
}

func requestStats(c *cancelapi.RequestCounts) RequestStats {
	return RequestStats{OK: c.OK.Load(), BadRequest: c.BadRequest.Load(), Busy: c.Busy.Load(), Failed: c.Failed.Load()}
}

// ListStats returns the list API's answers since start.
func (s *Service) ListStats() RequestStats { return requestStats(&s.answers.lists) }

// CancelAllStats returns the cancel-all API's answers since start (the
// messages they cancelled are counted by level, as every cancel's:
// [LevelStats]'s cancelled counter).
func (s *Service) CancelAllStats() RequestStats { return requestStats(&s.answers.cancelAlls) }

// RescheduleStats counts the reschedule API's answers
// (docs/pending.md#2-reschedule) by kind.
type RescheduleStats struct {
	Rescheduled, NotFound, AlreadyDelivered uint64
	// BadRequest counts requests refused as sent (400: the delay headers,
	// an ambiguous id), Busy those answered [ErrCancelBusy] (429), Failed
	// the other error answers (500, 503).
	BadRequest, Busy, Failed uint64
}

// RescheduleStats returns the reschedule API's answers since start.
func (s *Service) RescheduleStats() RescheduleStats {
	c := &s.answers.reschedules
	return RescheduleStats{Rescheduled: c.Rescheduled.Load(), NotFound: c.NotFound.Load(), AlreadyDelivered: c.Delivered.Load(),
		BadRequest: c.BadRequest.Load(), Busy: c.Busy.Load(), Failed: c.Failed.Load()}
}

// answerCounts counts one request API's answers by kind
// (deliver/internal/cancelapi, which counts them).
type answerCounts = cancelapi.Counts
