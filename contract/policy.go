package contract

import (
	"errors"
	"fmt"
	"strings"
)

// TargetPolicy is the operator's allow and deny lists of target subject
// patterns (NATS wildcards '*' and '>'). Deny wins. An empty allow list
// allows every target the contract allows. The zero value allows all.
//
// The policy narrows what delayd will deliver to; it never widens it: '$'
// subjects, the ingress prefix and delayd's internal subjects stay refused.
type TargetPolicy struct {
	// Allow lists the patterns a target must match one of; empty allows all.
	Allow []string
	// Deny lists the patterns no target may match; it wins over Allow.
	Deny []string
}

// ValidatePattern reports whether p is a valid subject pattern: non-empty
// tokens, '*' and '>' only as whole tokens, '>' only last, no white space.
func ValidatePattern(p string) error {
	if p == "" {
		return errors.New("empty pattern")
	}
	toks := strings.Split(p, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return fmt.Errorf("pattern %q: empty token", p)
		case t == ">" && i != len(toks)-1:
			return fmt.Errorf("pattern %q: '>' must be the last token", p)
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return fmt.Errorf("pattern %q: wildcards must be whole tokens", p)
		case strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return fmt.Errorf("pattern %q: white space or control characters", p)
		}
	}
	return nil
}

// Validate checks every pattern of p with [ValidatePattern] and returns the
// first error: a message naming the bad pattern.
func (p TargetPolicy) Validate() error {
	for _, pat := range append(append([]string(nil), p.Allow...), p.Deny...) {
		if err := ValidatePattern(pat); err != nil {
			return err
		}
	}
	return nil
}

// Check returns nil if the policy lets target through, or an error wrapping
// [ErrDeniedTarget].
func (p TargetPolicy) Check(target string) error {
	for _, d := range p.Deny {
		if MatchSubject(d, target) {
			return fmt.Errorf("%w: %q matches deny pattern %q", ErrDeniedTarget, target, d)
		}
	}
	if len(p.Allow) == 0 {
		return nil
	}
	for _, a := range p.Allow {
		if MatchSubject(a, target) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q matches no allow pattern", ErrDeniedTarget, target)
}

// MatchSubject reports whether the literal subject matches pattern, which
// may hold '*' (one token) and '>' (one or more trailing tokens) wildcard
// tokens, with NATS subject semantics.
func MatchSubject(pattern, subject string) bool {
	for {
		pi := strings.IndexByte(pattern, '.')
		si := strings.IndexByte(subject, '.')
		ptok, stok := pattern, subject
		if pi >= 0 {
			ptok = pattern[:pi]
		}
		if si >= 0 {
			stok = subject[:si]
		}
		if ptok == ">" {
			return true
		}
		if ptok != "*" && ptok != stok {
			return false
		}
		if pi < 0 || si < 0 {
			return pi < 0 && si < 0
		}
		pattern, subject = pattern[pi+1:], subject[si+1:]
	}
}
