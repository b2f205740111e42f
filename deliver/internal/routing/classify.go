package routing

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// Classifying an ingress message is pure: [classifier.classify] reads the
// subject and headers and returns a placement or the dead-letter reason, and
// [levelMessage] builds the level-stream message from it. Neither does I/O,
// keeps state or touches the ingress message; the router does the rest.
//
// Names within the router: a cascade is the chain of levels a
// Delay-Duration or Delay-Deliver-At message passes through; each move from
// one level stream to the next, through the ingress stream, is a hop.

// hopCheck is what the router found out about a message's hop headers
// (Delayd-Origin and its MAC) before classifying it.
type hopCheck uint8

const (
	hopNone   hopCheck = iota // no Delayd-Origin header: a new message
	hopValid                  // a hop: Delayd-Origin with a valid hop MAC
	hopForged                 // Delayd-Origin without a valid hop MAC: a publisher's own; routed as new
)

// checkHop checks m's hop headers with key. Only a message carrying
// Delayd-Origin is checked (the MAC costs an HMAC).
func checkHop(key hop.Key, subject string, h nats.Header) hopCheck {
	if h.Get(message.HdrOrigin) == "" {
		return hopNone
	}
	if key.Valid(subject, h) {
		return hopValid
	}
	return hopForged
}

// classifier classifies ingress messages against one configuration.
type classifier struct {
	prefix   string                // the ingress subject prefix: subjects are "<prefix>.<target>"
	levels   levels.Table          // the level table
	targets  contract.TargetPolicy // the operator's target policy
	maxDelay time.Duration         // the longest Delay-Duration or Delay-Deliver-At ahead of the store time
}

// placement is where an ingress message goes.
type placement struct {
	// Level is its level stream. For Delay-Duration and Delay-Deliver-At it
	// is the first level of its cascade (see cascadeLevel); level 0 is the
	// immediate level.
	Level levels.Level

	// Target is the subject it is delivered to: the ingress subject without
	// "<prefix>.".
	Target string

	// Due is the requested due time for Delay-Duration and
	// Delay-Deliver-At, exactly as requested (in the past included); zero
	// for a Delay-Level message, whose level's delay decides.
	Due time.Time

	// Merge is its merge key, "" if none: a new message's Delay-Merge-Key,
	// or the Delayd-Merge a hop carries on.
	Merge string

	// Clamped reports a Delay-Level above the table, clamped to the highest
	// level. It is set as soon as the level is known, so it is also set
	// next to a later merge-key error.
	Clamped bool

	// Hop is set when the message hops on from an earlier level (a valid
	// hop MAC): it keeps its first id, enqueue time and hop count.
	Hop bool
}

// classify places an ingress message published to subject with headers h,
// stored by the ingress stream at stored; hop is what [checkHop] found.
//
// The error is the message's dead-letter reason; its text is the
// dead letter's Delay-Error and [message.ReasonOf] gives its metric label. The checks
// run in this order, and the first failure is returned: the target (wraps
// [contract.ErrInvalidTarget], [contract.ErrForbiddenTarget] or [contract.ErrDeniedTarget]); the delay
// headers, matched case-insensitively, exactly one of them with exactly one
// value (wraps [levels.ErrMissingLevel], [levels.ErrInvalidLevel] or
// [levels.ErrLevelOverflow] for Delay-Level, [message.ErrInvalidDelay] for
// Delay-Duration and Delay-Deliver-At); the merge key (wraps
// [message.ErrInvalidMergeKey]).
// On an error the placement holds what was decided before it (Clamped in
// particular).
func (c *classifier) classify(subject string, h nats.Header, stored time.Time, hop hopCheck) (placement, error) {
	var p placement
	target, err := contract.Target(subject, c.prefix)
	if err == nil {
		err = c.targets.Check(target)
	}
	if err != nil {
		return p, err
	}
	d, err := message.ParseDelay(h, c.levels)
	if err != nil {
		return p, err
	}
	if d.Header != contract.HeaderLevel {
		if err := d.CheckMax(stored, c.maxDelay); err != nil {
			return p, err
		}
		due := d.Due(stored)
		p.Level, p.Due = c.cascadeLevel(due.Sub(stored)), due
	} else {
		p.Level, p.Clamped = d.Level, d.Clamped
	}
	p.Target = target
	if p.Merge, err = mergeKeyOf(h); err != nil {
		return p, err
	}
	if hop == hopValid {
		// A hop carries its merge key in Delayd-Merge (Delay-Merge-Key
		// is a control header, removed at its first placement).
		p.Hop, p.Merge = true, h.Get(message.HdrMerge)
	}
	return p, nil
}

// cascadeLevel picks the level for a remaining delay: the longest level not
// longer than it, so the message never waits past its due time. Below the
// table's shortest level, the longest precision level not longer than it
// (levels.Table.PrecisionLevels); below 1 ms, or nothing remaining, level 0,
// whose scanner waits for the due time itself. Without precision levels
// (DELAYD_PRECISION=off, levels.Table.WithoutPrecision), a remaining delay
// of 1 ms or more below the shortest level goes to the shortest level: its
// level wait ends after the due time, so the message carries no hop due and
// its scanner delivers it at its due time, or once the messages stored
// before it there are handed off (each by its own store time + the shortest
// delay), whichever is later: never early, late by less than the shortest
// delay.
func (c *classifier) cascadeLevel(remaining time.Duration) levels.Level {
	all := c.levels.Levels()
	if remaining < all[0].Delay {
		if !c.levels.Precision() {
			if remaining < levels.PrecisionMin {
				return levels.Level{}
			}
			return all[0]
		}
		all = c.levels.PrecisionLevels()
	}
	var pick levels.Level
	for _, l := range all {
		if l.Delay <= remaining {
			pick = l
		}
	}
	return pick
}

// mergeKeyOf returns a message's Delay-Merge-Key, "" if it has none. An
// empty or repeated value is invalid input.
func mergeKeyOf(h nats.Header) (string, error) {
	for k, v := range h {
		if !strings.EqualFold(k, contract.HeaderMergeKey) {
			continue
		}
		if len(v) != 1 || strings.TrimSpace(v[0]) == "" {
			return "", fmt.Errorf("%w: %s needs exactly one non-empty value", message.ErrInvalidMergeKey, contract.HeaderMergeKey)
		}
		return strings.TrimSpace(v[0]), nil
	}
	return "", nil
}

// levelHeaders is the number of headers delayd may add to a level message:
// Delay-Enqueued-At, Delay-Due-At, Delayd-Ingress, Delayd-Msg-Id,
// Delayd-Hop-Due, Delayd-Origin, Delayd-Hops, Delayd-Moves, Delayd-Merge,
// and the router's Nats-Expected-Last-Sequence.
const levelHeaders = 10

// levelMessage builds the level-stream message of ingress message m
// (published to subject, headers h, payload data) placed at p, stored by
// the ingress stream at stored, whose derived id is ingressRef. The
// message's subject is "delayd.level.<level name>.<target>".
//
// Its header is a fresh map: the publisher's headers without the control
// headers, JetStream instruction headers (Nats-*, which acted on the
// ingress stream and must not act again) and reserved Delayd-* headers, and
// with delayd's: Delay-Enqueued-At and Delay-Due-At (RFC 3339, UTC),
// Delayd-Ingress, the publisher's id as Delayd-Msg-Id, the merge key, and
// for a hop its first id, hop count and, if it was rescheduled, its move
// count (Delayd-Moves: a reschedule writes the message again as a hop,
// docs/pending.md#22-the-writes-in-order). When the level's wait ends before
// the due time, Delayd-Hop-Due says when, and the message hops on from
// there. h is not changed; header values are shared, never written.
//
// due is the message's final due time.
func levelMessage(h nats.Header, data []byte, p placement, levelSubject string, stored time.Time, ingressRef string) (out *nats.Msg, due time.Time) {
	// Sized for the common case: a delay header removed, and the
	// enqueue and due times, the derived id, the publisher's id and the
	// expected last sequence added.
	oh := make(nats.Header, len(h)+4)
	var origin, userID, enqueued, hops, moves string
	if p.Hop {
		origin, userID, enqueued, hops, moves = h.Get(message.HdrOrigin), h.Get(message.HdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(message.HdrHops), h.Get(message.HdrMoves)
	}
	for k, v := range h {
		if contract.IsControlHeader(k) || contract.IsInternalHeader(k) {
			if !p.Hop && strings.EqualFold(k, contract.HeaderNatsMsgID) && len(v) > 0 {
				userID = v[0]
			}
			continue
		}
		oh[k] = v
	}
	if enqueued == "" {
		enqueued = contract.FormatTime(stored)
	}
	// One backing array for delayd's header values: one allocation
	// instead of one per header.
	vals := make([]string, 0, levelHeaders-1)
	set := func(k, v string) {
		vals = append(vals, v)
		oh[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	delay := p.Level.Delay
	levelDue := stored.Add(delay)
	due = p.Due
	switch {
	case due.IsZero(): // a Delay-Level message
		due = levelDue
	case due.Before(stored) && !p.Hop: // a Delay-Deliver-At in the past: now
		due = stored
	case due.Before(stored): // a hop that arrives overdue (delayd was down): at once, due unchanged
	case levelDue.Before(due) && delay > 0: // more to wait after this level: it hops on
		set(message.HdrHopDue, contract.FormatTime(levelDue))
	}
	set(contract.HeaderEnqueuedAt, enqueued)
	set(contract.HeaderDueAt, contract.FormatTime(due))
	set(message.HdrIngress, ingressRef)
	if userID != "" {
		set(message.HdrMsgID, userID)
	}
	if p.Hop {
		set(message.HdrOrigin, origin)
		set(message.HdrHops, hops)
		if moves != "" {
			set(message.HdrMoves, moves)
		}
	}
	if p.Merge != "" {
		set(message.HdrMerge, p.Merge)
	}
	return &nats.Msg{Subject: levelSubject + p.Target, Header: oh, Data: data}, due
}
