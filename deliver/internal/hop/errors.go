package hop

import "errors"

var (
	// ErrKey is wrapped by the error deliver's Service.Run returns when the hop
	// secret stored in the offsets bucket is not one delayd wrote: wrong
	// length, unknown format or failed integrity check. It is not retried:
	// running on with another secret would change every derived delivery id.
	ErrKey = errors.New("hop secret is not one delayd wrote")
)
