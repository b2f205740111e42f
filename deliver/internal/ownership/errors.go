package ownership

import "errors"

// ErrNotOwner stops a scanner or the router whose lease term ended (or
// whose offset commit was fenced): another replica owns the work now.
var ErrNotOwner = errors.New("this replica no longer holds the lease")
