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

// answerCounts counts one request API's answers by kind
// (deliver/internal/cancelapi, which counts them).
type answerCounts = cancelapi.Counts
