package message

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/levels"
)

// DLQStream holds invalid and undeliverable messages, on the subjects
// "delayd.dlq.<reason>" ([contract.DLQSubjectPrefix]).
const DLQStream = "DELAYD_DLQ"

// Reasons lists every dead-letter reason, for metrics labels.
var Reasons = []string{ReasonLevel, ReasonTarget, ReasonSize, ReasonUndeliverable}

// Dead-letter reasons: the last token of the dead-letter subject
// "delayd.dlq.<reason>". The set is closed so it can label metrics.
const (
	ReasonLevel         = "level"         // bad Delay-Level
	ReasonTarget        = "target"        // invalid or forbidden target subject
	ReasonSize          = "size"          // too large once delayd's headers are added
	ReasonUndeliverable = "undeliverable" // a target refused it permanently
)

// ReasonCounts counts dead letters by reason.
type ReasonCounts struct{ n [4]atomic.Uint64 }

// Add counts a dead letter of reason (one of [Reasons]; others are not counted).
func (c *ReasonCounts) Add(reason string) {
	if c == nil {
		return
	}
	if i := slices.Index(Reasons, reason); i >= 0 {
		c.n[i].Add(1)
	}
}

// Snapshot returns the counts by reason.
func (c *ReasonCounts) Snapshot() map[string]uint64 {
	m := make(map[string]uint64, len(Reasons))
	for i, r := range Reasons {
		m[r] = c.n[i].Load()
	}
	return m
}

// ReasonOf maps an error to its dead-letter reason.
func ReasonOf(err error) string {
	switch {
	case errors.Is(err, contract.ErrInvalidTarget), errors.Is(err, contract.ErrForbiddenTarget), errors.Is(err, contract.ErrDeniedTarget):
		return ReasonTarget
	case errors.Is(err, levels.ErrMissingLevel), errors.Is(err, levels.ErrInvalidLevel), errors.Is(err, levels.ErrLevelOverflow),
		errors.Is(err, ErrInvalidDelay), errors.Is(err, ErrInvalidMergeKey):
		return ReasonLevel
	case errors.Is(err, ErrTooLarge):
		return ReasonSize
	}
	return ReasonUndeliverable
}

// DeadLetterMsg builds the DLQ message for a message published to subject.
// It keeps the payload and headers, except JetStream instruction headers
// (Nats-*), which would act on the dead-letter stream, and reserved Delayd-*
// headers; a publisher's Nats-Msg-Id is kept as Delay-Msg-Id. It adds Delay-Error and
// Delay-Subject, and dedupes on id, the message's derived ingress id.
func DeadLetterMsg(subject string, h nats.Header, data []byte, reason error, id string) *nats.Msg {
	if h == nil {
		h = make(nats.Header, 4)
	}
	for k, v := range h {
		switch {
		case HasPrefixFold(k, "Nats-"):
			if strings.EqualFold(k, contract.HeaderNatsMsgID) && len(v) > 0 {
				h[contract.HeaderMsgID] = []string{v[0]}
			}
			delete(h, k)
		case k == HdrMsgID: // the publisher's id, carried by a level message
			if len(v) > 0 {
				h[contract.HeaderMsgID] = []string{v[0]}
			}
			delete(h, k)
		case HasPrefixFold(k, HdrInternalPrefix):
			delete(h, k)
		}
	}
	h[contract.HeaderError] = []string{OneLine(reason.Error())}
	h[contract.HeaderSubject] = []string{subject}
	h[contract.HeaderNatsMsgID] = []string{id}
	return &nats.Msg{Subject: contract.DLQSubjectPrefix + ReasonOf(reason), Header: h, Data: data}
}

// OneLine makes s safe as a header value.
func OneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}

// TooLarge reports whether the server refused a write for its size: over the
// max payload, the stream's max message size, or the 64 KiB header limit.
func TooLarge(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, ErrTooLarge) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum, errCodeHeaderTooLarge:
			return true
		}
	}
	return false
}

// errCodeHeaderTooLarge is JetStream's "header size exceeds maximum allowed
// of 64k" (nats-server JSStreamHeaderExceedsMaximumErr).
const errCodeHeaderTooLarge jetstream.ErrorCode = 10097

// PublishDeadLetter stores a dead letter and waits for its PubAck. If the
// server refuses it for its size, it retries without the payload, then
// without the user headers, saying so in Delay-Error. Other failures are
// returned. Only DELAYD_DLQ's leader answers, and a leader that hangs never
// does: a copy not answered within [jswire.WriteAttempt] is sent again
// ([hedge.Do]), each carrying dl's Nats-Msg-Id, so the stream keeps one
// within its duplicate window, until one is answered or
// [jswire.OpTimeout] has passed (then the last timeout is returned).
func PublishDeadLetter(ctx context.Context, js jetstream.JetStream, dl *nats.Msg) error {
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		_, err := hedge.Do(pctx, jswire.WriteAttempt, func(ctx context.Context) (*jetstream.PubAck, error) {
			return js.PublishMsg(ctx, dl)
		})
		cancel()
		if err == nil || !TooLarge(err) || attempt == 2 {
			return err
		}
		reason := dl.Header.Get(contract.HeaderError)
		switch attempt {
		case 0:
			dl.Data = nil
			dl.Header[contract.HeaderError] = []string{reason + " (payload dropped: too large even for the dead-letter stream)"}
		case 1:
			keep := nats.Header{}
			for _, k := range []string{contract.HeaderError, contract.HeaderSubject, contract.HeaderNatsMsgID, contract.HeaderMsgID} {
				if v, ok := dl.Header[k]; ok {
					keep[k] = v
				}
			}
			keep[contract.HeaderError] = []string{reason + "; user headers dropped: too large even for the dead-letter stream"}
			dl.Header = keep
		}
	}
}

// Refusals tracks the dead letters DELAYD_DLQ refused and that are not
// stored yet, shared by the router and the scanners. A nil *Refusals
// tracks nothing.
type Refusals struct {
	failures atomic.Uint64 // refused dead-letter writes, every attempt

	mu      sync.Mutex
	waiting map[string]refusal // by dead letter
	lastErr error
}

// refusal is when a waiting dead letter was first and last refused
// (monotonic clock readings).
type refusal struct{ first, last time.Time }

// refusalForgotten is how long after its last refusal a dead letter that was
// neither retried nor stored stops counting as waiting (its message was
// removed from ingress by hand, say). A waiting dead letter is retried at
// least every 5 s.
const refusalForgotten = 2 * time.Minute

// Refused records a failed write of the dead letter named key (the
// scanner's stream, or the router's ingress reference). It reports whether
// this is the key's first refusal (it was not waiting), so that callers log
// the first at warn and its retries at debug.
func (d *Refusals) Refused(key string, err error) (first bool) {
	if d == nil {
		return true
	}
	d.failures.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiting == nil {
		d.waiting = make(map[string]refusal)
	}
	now := time.Now()
	r, ok := d.waiting[key]
	if !ok {
		r.first = now
	}
	r.last = now
	d.waiting[key] = r
	d.lastErr = err
	return !ok
}

// Stored records that the dead letter named key is stored.
func (d *Refusals) Stored(key string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	delete(d.waiting, key)
	d.mu.Unlock()
}

// Forget drops the router's waiting dead letters (keys with prefix): a new
// ingress session redelivers them, and they are recorded again if refused.
func (d *Refusals) Forget(prefix string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	for k := range d.waiting {
		if strings.HasPrefix(k, prefix) {
			delete(d.waiting, k)
		}
	}
	d.mu.Unlock()
}

// RouterWaiting counts the router's waiting dead letters: invalid messages
// left in ingress until their dead letter is stored.
func (d *Refusals) RouterWaiting() int {
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for k, w := range d.waiting {
		if strings.HasPrefix(k, RouterRefusal) && time.Since(w.last) <= refusalForgotten {
			n++
		}
	}
	return n
}

// RouterRefusal prefixes the router's keys in [Refusals].
const RouterRefusal = "router:"

// RefusalStats is the state of dead letters DELAYD_DLQ refuses.
type RefusalStats struct {
	Failures uint64        // refused dead-letter writes since start, every attempt
	Waiting  int           // dead letters refused and not stored yet
	Oldest   time.Duration // how long the oldest waiting one has been refused; 0 if none
	LastErr  error         // the last refusal's error
}

// Snapshot returns the refusals' state; it drops the waiting dead letters
// forgotten meanwhile.
func (d *Refusals) Snapshot() RefusalStats {
	if d == nil {
		return RefusalStats{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := RefusalStats{Failures: d.failures.Load(), LastErr: d.lastErr}
	for k, w := range d.waiting {
		if time.Since(w.last) > refusalForgotten {
			delete(d.waiting, k)
			continue
		}
		r.Waiting++
		r.Oldest = max(r.Oldest, time.Since(w.first))
	}
	return r
}
