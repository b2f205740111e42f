package contract

import (
	"errors"
	"fmt"
	"strings"
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
