package deliver

import (
	"errors"
	"fmt"
	"strings"
)

// Internal subject space. Every subject delayd itself uses lives under
// [InternalPrefix]; a target there is refused.
const (
	InternalPrefix = "delayd"
	levelSubjects  = "delayd.level."
	dlqSubjects    = "delayd.dlq."
	// CancelSubject is the unscoped cancel API, the operator's form: a
	// request whose payload is a message id, answered "cancelled", "not
	// found" or "already delivered", for a message of any target. Publishers
	// use the scoped form [CancelSubjectFor], which server permissions can
	// limit by target.
	CancelSubject = "delayd.api.cancel"
)

// CancelSubjectFor is the scoped cancel API subject of target,
// "delayd.api.cancel.<target>": a request there cancels only a message
// whose target subject is target, and answers "not found" for any other,
// so a NATS user allowed to publish to "delayd.api.cancel.orders.>" can
// cancel only messages bound for orders.>.
func CancelSubjectFor(target string) string { return CancelSubject + "." + target }

// Sentinel errors for invalid input. Each dead letter's Delay-Error starts
// with one of these texts, and the DLQ subject names its reason.
var (
	// ErrInvalidTarget means the target subject is empty, has empty tokens,
	// wildcards or white space, or is otherwise not a valid NATS subject.
	ErrInvalidTarget = errors.New("invalid target subject")

	// ErrForbiddenTarget means the target starts with '$' (the JetStream,
	// system and KV APIs), lies under the ingress prefix (a loop) or under
	// delayd's own internal subjects.
	ErrForbiddenTarget = errors.New("forbidden target subject")
)

// Target returns the target subject of an ingress subject "<prefix>.<target>"
// and validates it. Errors wrap [ErrInvalidTarget] or [ErrForbiddenTarget].
func Target(subject, prefix string) (string, error) {
	if len(subject) <= len(prefix) || subject[:len(prefix)] != prefix || subject[len(prefix)] != '.' {
		return "", fmt.Errorf("%w: %q is not under the ingress prefix %q", ErrInvalidTarget, subject, prefix)
	}
	target := subject[len(prefix)+1:]
	if err := ValidateTarget(target, prefix); err != nil {
		return "", err
	}
	return target, nil
}

// ValidateTarget reports whether target may receive deliveries: a valid
// literal NATS subject, not starting with '$', and not under the ingress
// prefix or delayd's internal subjects. Errors wrap [ErrInvalidTarget] or
// [ErrForbiddenTarget].
func ValidateTarget(target, prefix string) error {
	if err := validLiteralSubject(target); err != nil {
		return fmt.Errorf("%w: %q: %s", ErrInvalidTarget, target, err)
	}
	switch {
	case target[0] == '$':
		return fmt.Errorf("%w: %q: subjects starting with '$' are NATS APIs", ErrForbiddenTarget, target)
	case underSubject(target, prefix):
		return fmt.Errorf("%w: %q: under the ingress prefix %q (it would loop)", ErrForbiddenTarget, target, prefix)
	case underSubject(target, InternalPrefix):
		return fmt.Errorf("%w: %q: under delayd's internal subjects %q", ErrForbiddenTarget, target, InternalPrefix+".>")
	}
	return nil
}

// underSubject reports whether s is root or lies under "root.".
func underSubject(s, root string) bool {
	return s == root || strings.HasPrefix(s, root+".")
}

// validLiteralSubject checks NATS subject syntax for a publish subject:
// non-empty tokens, no wildcard tokens, no white space or control bytes.
func validLiteralSubject(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			if c <= ' ' || c == 0x7f {
				return fmt.Errorf("white space or control byte at %d", i)
			}
			if c != '.' {
				continue
			}
		}
		tok := s[start:i]
		switch tok {
		case "":
			return fmt.Errorf("empty token at %d", start)
		case "*", ">":
			return fmt.Errorf("wildcard token %q", tok)
		}
		start = i + 1
	}
	return nil
}
