package deliver

import "github.com/delayd/delayd/deliver/internal/jswire"

// writeAttempt bounds one copy of a write to a stream whose answer only
// the stream's leader gives ([jswire.WriteAttempt]); publishAsyncTimeout
// is the bound it shortens.
const writeAttempt = jswire.WriteAttempt
