package deliver

import (
	"time"

	"github.com/delayd/delayd/deliver/internal/message"
)

// DLQStream holds invalid and undeliverable messages, on the subjects
// "delayd.dlq.<reason>" ([contract.DLQSubjectPrefix]).
const DLQStream = message.DLQStream

// Reasons lists every dead-letter reason, for metrics labels.
var Reasons = message.Reasons

// Dead-letter reasons: the last token of the dead-letter subject
// "delayd.dlq.<reason>". The set is closed so it can label metrics.
const (
	ReasonLevel         = message.ReasonLevel         // bad Delay-Level
	ReasonTarget        = message.ReasonTarget        // invalid or forbidden target subject
	ReasonSize          = message.ReasonSize          // too large once delayd's headers are added
	ReasonUndeliverable = message.ReasonUndeliverable // a target refused it permanently
)

// DLQRefusals is the state of dead letters DELAYD_DLQ refuses.
type DLQRefusals struct {
	Failures uint64        // refused dead-letter writes since start, every attempt
	Waiting  int           // dead letters refused and not stored yet
	Oldest   time.Duration // how long the oldest waiting one has been refused; 0 if none
	LastErr  error         // the last refusal's error
}
