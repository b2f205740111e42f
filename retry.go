package delayd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// HeaderRetryHistory is set by [Retry] and [RetryMsg]: one value per retry,
// appended in order, each a one-line record that [ParseRetryRecord] reads:
//
//	attempt=1 at=2026-11-30T10:00:00.123456789Z delay=1m0s cause="payment gateway: timeout"
//
// at is the retrying consumer's clock (RFC 3339, ns, UTC), delay the rung it
// was published with, cause the text of the error it failed with, cut to
// [RetryCauseMax] bytes.
const HeaderRetryHistory = "Delay-Retry-History"

// ReasonRetries is the dead-letter reason of a message whose retry ladder is
// exhausted: it is written to the subject "delayd.dlq.retries" of the
// dead-letter stream by [Retry], not by delayd.
const ReasonRetries = "retries"

// RetryCauseMax bounds the bytes of a cause's text kept in a
// [HeaderRetryHistory] record and in Delay-Error; a longer text is cut at a
// rune boundary and ends with "...".
const RetryCauseMax = 256

// LadderMaxRungs bounds a ladder's length, so that the retry history of its
// last rung (one record per rung, each under 600 bytes) stays well below
// JetStream's 64 KiB header limit.
const LadderMaxRungs = 64

// Ladder is a retry ladder: the delay before each retry, in order. Retry
// attempt n (1-based) waits Ladder[n-1]; after the last rung the message is
// dead-lettered. Rungs need not increase: "30s 30s 30s" is a fixed backoff.
type Ladder []time.Duration

// ParseLadder parses rungs separated by white space, for example
// "1m 5m 10m 30m 1h", in the grammar of delayd's level table (units ms, s,
// m, h and d; "1m30s" and "1.5s" too; see [levels.ParseDuration]). Unlike a
// level table, rungs may repeat and need not increase. Errors wrap
// [ErrInvalidLadder] and name the bad rung.
func ParseLadder(text string) (Ladder, error) {
	tokens := strings.Fields(text)
	l := make(Ladder, 0, len(tokens))
	for i, tok := range tokens {
		d, err := levels.ParseDuration(tok)
		if err != nil {
			return nil, fmt.Errorf("%w: rung %d: %w", ErrInvalidLadder, i+1, err)
		}
		l = append(l, d)
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// MustParseLadder is [ParseLadder] for constants; it panics on an error.
func MustParseLadder(text string) Ladder {
	l, err := ParseLadder(text)
	if err != nil {
		panic(err)
	}
	return l
}

// Validate reports whether l is usable: 1 to [LadderMaxRungs] rungs, each
// greater than 0. Errors wrap [ErrInvalidLadder]. A rung beyond delayd's
// DELAYD_MAX_DELAY (default 168h) passes here but is dead-lettered by delayd
// with reason "level".
func (l Ladder) Validate() error {
	switch {
	case len(l) == 0:
		return fmt.Errorf("%w: no rungs (want durations separated by spaces, e.g. %q)", ErrInvalidLadder, "1m 5m 10m 30m 1h")
	case len(l) > LadderMaxRungs:
		return fmt.Errorf("%w: %d rungs, at most %d", ErrInvalidLadder, len(l), LadderMaxRungs)
	}
	for i, d := range l {
		if d <= 0 {
			return fmt.Errorf("%w: rung %d is %s, want > 0", ErrInvalidLadder, i+1, d)
		}
	}
	return nil
}

// String returns the ladder in [ParseLadder]'s form: "1m 5m 1h30m".
func (l Ladder) String() string {
	parts := make([]string, len(l))
	for i, d := range l {
		parts[i] = levels.FormatDuration(d)
	}
	return strings.Join(parts, " ")
}

// RetryOpt is an option of [Retry] and [RetryMsg].
type RetryOpt func(*retryOpts) error

type retryOpts struct {
	prefix string
}

// WithRetryPrefix sets delayd's ingress prefix when DELAYD_PREFIX is not
// "delay" ([PrefixDefault]).
func WithRetryPrefix(prefix string) RetryOpt {
	return func(o *retryOpts) error {
		if prefix == "" {
			return fmt.Errorf("%w: empty ingress prefix", ErrInvalidRetry)
		}
		o.prefix = prefix
		return nil
	}
}

// RetryResult tells what [Retry] did.
type RetryResult struct {
	// DeadLettered is true when the ladder was exhausted and the message
	// was written to the dead-letter stream instead of retried.
	DeadLettered bool
	// Attempt is the retry's Delay-Attempt (1 for the first retry). When
	// dead-lettered it is the delivered message's Delay-Attempt: the
	// retries made, the ladder's length unless the ladder was shortened.
	Attempt int
	// Delay is the rung the retry waits; 0 when dead-lettered.
	Delay time.Duration
	// Subject is where the message was published: "<prefix>.<subject>" for
	// a retry, "delayd.dlq.retries" for a dead letter.
	Subject string
	// MsgID is the Nats-Msg-Id it was published with; empty when the
	// delivered message had no id to derive one from (see [RetryMsg]).
	MsgID string
	// Sequence is the stream sequence of the PubAck: in DELAYD_INGRESS, or
	// in DELAYD_DLQ when dead-lettered.
	Sequence uint64
	// Duplicate is true when the stream had the MsgID already: an earlier
	// call for the same attempt (a consumer that crashed after Retry
	// and before its ack) already published it, and Sequence is that
	// one's. It is the [*DuplicateError] that [Publish] returns, taken
	// for success: the id is Retry's own, one per delivery and attempt,
	// so the message stored with it is this retry. Ack the delivery.
	Duplicate bool
}

// Retry hands a JetStream-consumed message that failed with cause back to
// delayd with the next rung of ladder; see [RetryMsg], which it calls with
// the message's subject, headers and payload. When the message has no
// Nats-Msg-Id, the id is derived from its stream and stream sequence.
func Retry(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, ladder Ladder, cause error, opts ...RetryOpt) (RetryResult, error) {
	if msg == nil {
		return RetryResult{}, fmt.Errorf("%w: nil message", ErrInvalidRetry)
	}
	m := &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}
	if meta, err := msg.Metadata(); err == nil {
		return retry(ctx, js, m, ladder, cause, meta.Stream+"-"+strconv.FormatUint(meta.Sequence.Stream, 10), opts)
	}
	return retry(ctx, js, m, ladder, cause, "", opts)
}

// RetryMsg hands a message that failed with cause back to delayd, as
// delivered on its target subject (msg.Subject, e.g. "orders.close"), with
// the next rung of ladder. It reads the attempt from the Delay-Attempt header
// (absent: 0, the first delivery). While a rung remains it publishes the
// message through JetStream to "<prefix>.<msg.Subject>" with Delay-Duration
// set to the rung, Delay-Attempt to the attempt + 1 and a record appended
// to [HeaderRetryHistory], and waits for the PubAck. After the last rung it
// writes the message to the dead-letter stream DELAYD_DLQ on
// "delayd.dlq.retries" instead, with Delay-Error ("retries exhausted after
// 4 failed deliveries (the first and 3 retries, ladder 1m 5m 10m):
// <cause>", for a ladder of 3 rungs), Delay-Subject (the ingress subject, so it can be
// published there again), Delay-Msg-Id (the delivered Nats-Msg-Id) and the
// history. The payload is unchanged either way.
//
// The headers delayd sets on delivery (Delay-Enqueued-At, Delay-Due-At,
// Delay-Hops) and every Nats-* and Delayd-* header are removed from a retry;
// other headers are kept. The retry's Nats-Msg-Id is "<id>-retry<n>", where
// id is the delivered Nats-Msg-Id without its own "-retry<n-1>" suffix, so
// calling Retry twice for one attempt within the ingress stream's duplicate
// window (2 min) stores one retry (reported by [RetryResult].Duplicate), and
// a stream on the target does not drop the retry as a duplicate of the
// first delivery. The dead letter's id is "<id>-retries-exhausted". delayd
// always sets a Nats-Msg-Id on delivery; for a message published straight
// to its subject without one, *nats.Msg from a JetStream subscription uses
// its stream and sequence, and a plain core message is published without an
// id, so it is not deduped.
//
// Ack the delivered message once Retry returns nil; on an error, leave it
// unacked (or Nak it) so it is delivered again. Retry does not ack. Each
// retry is a new delayed message: its delay counts from when ingress stores
// it, not from the failed delivery.
//
// Like [Publish], Retry checks a retry against the running delayd's limits
// (its [Info], cached per connection) when a delayd answers: a rung beyond
// DELAYD_MAX_DELAY is an error wrapping [ErrInvalidLadder], a target the
// policy denies wraps [ErrDeniedTarget], a message too large
// [ErrTooLarge], another prefix [ErrPrefixMismatch]. Nothing is published
// then: leave the message unacked, or dead-letter it yourself.
//
// Errors wrap [ErrInvalidLadder], [ErrInvalidRetry], [ErrInvalidTarget]
// or [ErrForbiddenTarget] (a subject delayd would dead-letter), the
// limit errors above, or the publish's error (for example
// jetstream.ErrNoStreamResponse when delayd's streams do not exist).
func RetryMsg(ctx context.Context, js jetstream.JetStream, msg *nats.Msg, ladder Ladder, cause error, opts ...RetryOpt) (RetryResult, error) {
	if msg == nil {
		return RetryResult{}, fmt.Errorf("%w: nil message", ErrInvalidRetry)
	}
	fallback := ""
	if meta, err := msg.Metadata(); err == nil {
		fallback = meta.Stream + "-" + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	return retry(ctx, js, msg, ladder, cause, fallback, opts)
}

func retry(ctx context.Context, js jetstream.JetStream, msg *nats.Msg, ladder Ladder, cause error, fallbackID string, opts []RetryOpt) (RetryResult, error) {
	var o retryOpts
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return RetryResult{}, err
		}
	}
	o.prefix = cmp.Or(o.prefix, PrefixDefault)
	if err := ladder.Validate(); err != nil {
		return RetryResult{}, err
	}
	if msg.Subject == "" {
		return RetryResult{}, fmt.Errorf("%w: message has no subject", ErrInvalidRetry)
	}
	if err := contract.ValidateTarget(msg.Subject, o.prefix); err != nil {
		return RetryResult{}, fmt.Errorf("delayd: retry: %w", err)
	}
	attempt, err := attemptOf(msg.Header)
	if err != nil {
		return RetryResult{}, err
	}
	delivered := headerFold(msg.Header, contract.HeaderNatsMsgID)
	base := cmp.Or(strings.TrimSuffix(delivered, "-retry"+strconv.Itoa(attempt)), fallbackID)
	if attempt == 0 {
		base = cmp.Or(delivered, fallbackID)
	}
	ingress := o.prefix + "." + msg.Subject
	causeText := "(no cause given)"
	if cause != nil {
		causeText = truncate(oneLine(cause.Error()), RetryCauseMax)
	}

	if attempt >= len(ladder) {
		h := copyHeader(msg.Header, contract.IsInternalHeader)
		h[contract.HeaderError] = []string{exhaustedText(attempt, ladder, causeText)}
		h[contract.HeaderSubject] = []string{ingress}
		if delivered != "" {
			h[contract.HeaderMsgID] = []string{delivered}
		}
		res := RetryResult{DeadLettered: true, Attempt: attempt, Subject: contract.DLQSubjectPrefix + ReasonRetries}
		if base != "" {
			res.MsgID = base + "-retries-exhausted"
		}
		ack, err := publishMsg(ctx, js, &nats.Msg{Subject: res.Subject, Header: h, Data: msg.Data}, res.MsgID)
		if err := res.noteDuplicate(err); err != nil {
			return RetryResult{}, fmt.Errorf("delayd: retry: dead-letter to %s: %w", res.Subject, err)
		}
		res.Sequence = ack.Sequence
		return res, nil
	}

	res := RetryResult{Attempt: attempt + 1, Delay: ladder[attempt], Subject: ingress}
	h := copyHeader(msg.Header, func(k string) bool {
		// delayd's control headers (a second delay header would make the
		// retry ambiguous; the delivery headers are set again) and the
		// attempt counter, set below. The history is kept.
		return contract.IsInternalHeader(k) || contract.IsControlHeader(k) || strings.EqualFold(k, contract.HeaderAttempt)
	})
	h[contract.HeaderDuration] = []string{res.Delay.String()}
	h[contract.HeaderAttempt] = []string{strconv.Itoa(res.Attempt)}
	h[HeaderRetryHistory] = append(h[HeaderRetryHistory], RetryRecord{
		Attempt: res.Attempt, At: time.Now(), Delay: res.Delay, Cause: causeText,
	}.String())
	if base != "" {
		res.MsgID = base + "-retry" + strconv.Itoa(res.Attempt)
	}
	out := &nats.Msg{Subject: ingress, Header: h, Data: msg.Data}
	// The running delayd's limits, as Publish checks them (docs/guide.md#from-go);
	// with no delayd answering, the retry is published unchecked.
	if info, err := connInfo(ctx, js.Conn()); err == nil {
		if info.Prefix != o.prefix {
			return RetryResult{}, fmt.Errorf("%w: %q, delayd's is %q", ErrPrefixMismatch, o.prefix, info.Prefix)
		}
		what := fmt.Sprintf("rung %d (%s) of ladder %s", res.Attempt, res.Delay, ladder)
		if err := checkLimits(info, msg.Subject, out, res.MsgID, res.Delay, what, ErrInvalidLadder); err != nil {
			return RetryResult{}, fmt.Errorf("delayd: retry: %w", err)
		}
	}
	ack, err := publishMsg(ctx, js, out, res.MsgID)
	if err := res.noteDuplicate(err); err != nil {
		return RetryResult{}, fmt.Errorf("delayd: retry: publish attempt %d to %s: %w", res.Attempt, ingress, err)
	}
	res.Sequence = ack.Sequence
	return res, nil
}

// noteDuplicate takes publishMsg's [*DuplicateError] for what it is for
// Retry: the id is Retry's own, derived from the delivery and the attempt,
// so the message stored with it is this retry (or dead letter), published
// by an earlier call for the same delivery. It sets Duplicate and returns
// nil for it; any other error it returns.
func (r *RetryResult) noteDuplicate(err error) error {
	var dup *DuplicateError
	if errors.As(err, &dup) {
		r.Duplicate = true
		return nil
	}
	return err
}

// exhaustedText is the Delay-Error of a message dead-lettered after the
// delivery of retry attempt failed: counted as users count failures, the
// first delivery and each retry, "retries exhausted after 4 failed
// deliveries (the first and 3 retries, ladder 1m 5m 10m): <cause>".
func exhaustedText(attempt int, ladder Ladder, cause string) string {
	retries := "retries"
	if attempt == 1 {
		retries = "retry"
	}
	return fmt.Sprintf("%s after %d failed deliveries (the first and %d %s, ladder %s): %s", ErrRetriesExhausted, attempt+1, attempt, retries, ladder, cause)
}

// attemptOf reads Delay-Attempt, matched in any case: absent is 0.
func attemptOf(h nats.Header) (int, error) {
	var values []string
	for k, v := range h {
		if strings.EqualFold(k, contract.HeaderAttempt) {
			values = append(values, v...)
		}
	}
	switch len(values) {
	case 0:
		return 0, nil
	case 1:
	default:
		return 0, fmt.Errorf("%w: %s has %d values, want one", ErrInvalidRetry, contract.HeaderAttempt, len(values))
	}
	n, err := strconv.Atoi(strings.TrimSpace(values[0]))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s %q is not a non-negative integer", ErrInvalidRetry, contract.HeaderAttempt, values[0])
	}
	return n, nil
}

// RetryRecord is one value of [HeaderRetryHistory].
type RetryRecord struct {
	Attempt int           // the retry's Delay-Attempt, 1-based
	At      time.Time     // when the consumer called Retry, by its clock
	Delay   time.Duration // the rung the retry waited
	Cause   string        // the failure's text, one line, at most RetryCauseMax bytes
}

// String formats r as a [HeaderRetryHistory] value.
func (r RetryRecord) String() string {
	return fmt.Sprintf("attempt=%d at=%s delay=%s cause=%s", r.Attempt, contract.FormatTime(r.At), r.Delay, strconv.Quote(r.Cause))
}

// ParseRetryRecord parses one [HeaderRetryHistory] value. Errors wrap
// [ErrInvalidRetry].
func ParseRetryRecord(s string) (RetryRecord, error) {
	var r RetryRecord
	bad := func(why string) (RetryRecord, error) {
		return RetryRecord{}, fmt.Errorf("%w: retry record %q: %s", ErrInvalidRetry, s, why)
	}
	head, quoted, ok := strings.Cut(s, " cause=")
	if !ok {
		return bad("no cause")
	}
	cause, err := strconv.Unquote(quoted)
	if err != nil {
		return bad("cause is not a quoted string")
	}
	r.Cause = cause
	fields := strings.Fields(head)
	if len(fields) != 3 {
		return bad("want attempt=, at=, delay= and cause=")
	}
	for i, key := range [3]string{"attempt=", "at=", "delay="} {
		v, ok := strings.CutPrefix(fields[i], key)
		if !ok {
			return bad("want " + key)
		}
		switch i {
		case 0:
			r.Attempt, err = strconv.Atoi(v)
		case 1:
			r.At, err = time.Parse(time.RFC3339Nano, v)
		case 2:
			r.Delay, err = time.ParseDuration(v)
		}
		if err != nil {
			return bad(err.Error())
		}
	}
	return r, nil
}

// RetryHistory parses every [HeaderRetryHistory] value of h, in order.
func RetryHistory(h nats.Header) ([]RetryRecord, error) {
	var out []RetryRecord
	for _, v := range h[HeaderRetryHistory] {
		r, err := ParseRetryRecord(v)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// copyHeader copies h without the keys drop reports.
func copyHeader(h nats.Header, drop func(string) bool) nats.Header {
	out := make(nats.Header, len(h)+4)
	for k, v := range h {
		if !drop(k) {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}

// headerFold returns the first value of key, matched in any case.
func headerFold(h nats.Header, key string) string {
	if v := h.Get(key); v != "" {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// oneLine makes s safe as a header value and cheap to quote: control
// characters become spaces, invalid UTF-8 becomes U+FFFD.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// truncate cuts s to at most n bytes at a rune boundary, ending with "...".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
