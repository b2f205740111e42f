package deliver

import (
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
)

// Test aliases of names that moved to deliver/internal/level in step L1
// (docs/reshape.md#6-steps-in-order), as compat.go's for the package's own
// files.

const (
	decidePending    = level.ReplyPending
	decideNotPending = level.ReplyNotPending
)

// answerText gives an answer's word on the decide subject, for failure
// messages.
var answerText = func() map[cancelAnswer]string {
	m := make(map[cancelAnswer]string)
	for a := answerCancelled; a <= answerPending; a++ {
		m[a] = a.String()
	}
	return m
}()

// isMarker is message.IsMarker: the router's epoch marker moved to
// deliver/internal/routing in step R1.
func isMarker(subject string) bool { return message.IsMarker(subject) }

// isMarkerMsg reports whether m, as read by direct get (its subject in the
// Nats-Subject header) or from a consumer (its own subject), is a marker
// (routing's, for a failure message of this package's tests).
func isMarkerMsg(m *nats.Msg) bool {
	if s := m.Header.Get(hdrJSSubject); s != "" {
		return isMarker(s)
	}
	return isMarker(m.Subject)
}
