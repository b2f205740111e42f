package contract

import "errors"

// Sentinel errors for a target subject delayd refuses. A dead letter's
// Delay-Error starts with one of these texts (reason "target"); wrapped
// errors add the subject and why.
var (
	// ErrInvalidTarget means the target subject is empty, has empty tokens,
	// wildcards or white space, or is otherwise not a valid NATS subject.
	ErrInvalidTarget = errors.New("invalid target subject")

	// ErrForbiddenTarget means the target starts with '$' (the JetStream,
	// system and KV APIs), lies under the ingress prefix (a loop) or under
	// delayd's own internal subjects.
	ErrForbiddenTarget = errors.New("forbidden target subject")

	// ErrDeniedTarget means the operator's target policy refuses the target:
	// it matches a deny pattern, or an allow list exists and it matches none.
	ErrDeniedTarget = errors.New("target denied by policy")
)
