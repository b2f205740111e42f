package jswire

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrPubAcksClosed resolves a write still awaiting its PubAck when its
// [PubAcks] is closed: the write may or may not be stored.
var ErrPubAcksClosed = errors.New("jswire: PubAck tracker closed")

// PubAcks publishes messages to subjects bound to streams and tracks their
// PubAcks, in place of the jetstream package's async publish on the hot
// path. One subscription takes every reply (reply subject "<inbox>.<n>", n
// counting the writes from 1); a PubAck is read from its bytes (the
// "stream", "seq", "duplicate", "domain" and "val" fields of a flat object,
// anything else through encoding/json); and one sweep every timeout/8
// resolves the writes whose PubAck is older than timeout, instead of a
// timer per write.
//
// Outcomes are the jetstream package's, so callers test them the same way:
// a stored write's *jetstream.PubAck; a refusal's *jetstream.APIError (the
// server's code, err_code and description); [jetstream.ErrNoStreamResponse]
// when no stream listens on the subject (not retried);
// [jetstream.ErrAsyncPublishTimeout] when no PubAck came within timeout
// (the write may be stored); [nats.ErrDisconnected] for a write pending
// when the connection started reconnecting, if asked for
// ([PubAcks.FailOnDisconnect]; the write may be stored);
// [jetstream.ErrInvalidJSAck] for a reply that is no PubAck;
// [ErrPubAcksClosed] for a write pending at [PubAcks.Close].
//
// Safe for concurrent use.
type PubAcks struct {
	nc      *nats.Conn
	prefix  string // "<inbox>."
	sub     *nats.Subscription
	timeout time.Duration

	mu      sync.Mutex
	next    uint64 // the last id given out
	oldest  uint64 // every id below it is resolved
	pending map[uint64]*PubAckFuture
	closed  bool
	lose    func(n uint64) bool // fault tests: replies to drop as lost (LoseReplies)

	status     chan nats.Status // the connection's RECONNECTING events (FailOnDisconnect); nil if not asked
	statusDone chan struct{}    // closed when the status goroutine ends

	stop chan struct{}
	done chan struct{}
}

// PubAckFuture is one write's outcome, known once Done is closed.
type PubAckFuture struct {
	sent time.Time
	done chan struct{}
	ack  jetstream.PubAck
	err  error
}

// Done is closed once the write's outcome is known.
func (f *PubAckFuture) Done() <-chan struct{} { return f.done }

// Result returns the write's PubAck, or its error (see [PubAcks]). Call it
// only once Done is closed.
func (f *PubAckFuture) Result() (*jetstream.PubAck, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &f.ack, nil
}

// NewPubAcks subscribes a reply inbox on nc and returns a tracker whose
// writes fail with [jetstream.ErrAsyncPublishTimeout] after timeout (> 0)
// without a PubAck. The error is the subscription's. Close it when done.
func NewPubAcks(nc *nats.Conn, timeout time.Duration) (*PubAcks, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("jswire: PubAck timeout %v: must be positive", timeout)
	}
	t := &PubAcks{
		nc: nc, prefix: nc.NewInbox() + ".", timeout: timeout,
		oldest: 1, pending: make(map[uint64]*PubAckFuture),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	sub, err := nc.Subscribe(t.prefix+"*", t.reply)
	if err != nil {
		return nil, fmt.Errorf("subscribe PubAck inbox: %w", err)
	}
	t.sub = sub
	go t.sweepLoop()
	return t, nil
}

// Publish sends m with a reply subject of the tracker's and returns its
// future. m.Reply must be empty; it is set for the call only and restored,
// so m may be published again (a retry is a new write with a new id). The
// error is the connection's (nats.ErrMaxPayload for a message the server
// would refuse for its size, for example): then nothing was sent.
func (t *PubAcks) Publish(m *nats.Msg) (*PubAckFuture, error) {
	if m.Reply != "" {
		return nil, jetstream.ErrAsyncPublishReplySubjectSet
	}
	f := &PubAckFuture{sent: time.Now(), done: make(chan struct{})}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrPubAcksClosed
	}
	t.next++
	id := t.next
	t.pending[id] = f
	t.mu.Unlock()

	var buf [20]byte
	m.Reply = t.prefix + string(strconv.AppendUint(buf[:0], id, 10))
	err := t.nc.PublishMsg(m)
	m.Reply = ""
	if err != nil {
		t.mu.Lock()
		delete(t.pending, id)
		t.mu.Unlock()
		return nil, err
	}
	return f, nil
}

// FailOnDisconnect makes every write pending when the connection starts
// reconnecting fail at once with [nats.ErrDisconnected], as the jetstream
// package's async publish does, instead of after the timeout: a PubAck the
// server sent meanwhile went to the lost connection. The write may be
// stored. A write sent while the connection reconnects (buffered) may fail
// with it too, if the event is handled after it was sent. Call it once,
// before the writes it should cover; [PubAcks.Close] stops it.
func (t *PubAcks) FailOnDisconnect() {
	t.mu.Lock()
	if t.closed || t.status != nil {
		t.mu.Unlock()
		return
	}
	t.status = t.nc.StatusChanged(nats.RECONNECTING)
	t.statusDone = make(chan struct{})
	status, done := t.status, t.statusDone
	t.mu.Unlock()
	go func() {
		defer close(done)
		for range status { // closed by Close (RemoveStatusListener)
			t.failPending(nats.ErrDisconnected)
		}
	}()
}

// failPending resolves every pending write with err.
func (t *PubAcks) failPending(err error) {
	t.mu.Lock()
	if t.closed || len(t.pending) == 0 {
		t.mu.Unlock()
		return
	}
	failed := make([]*PubAckFuture, 0, len(t.pending))
	for id, f := range t.pending {
		failed = append(failed, f)
		delete(t.pending, id)
	}
	t.mu.Unlock()
	for _, f := range failed {
		f.err = err
		close(f.done)
	}
}

// LoseReplies makes the tracker drop the reply to its n-th write (n from
// 1) when lose(n) is true, as if the PubAck were lost in transit: the write
// then times out. For fault tests; lose runs on the reply goroutine.
func (t *PubAcks) LoseReplies(lose func(n uint64) bool) {
	t.mu.Lock()
	t.lose = lose
	t.mu.Unlock()
}

// Pending returns how many writes await their PubAck.
func (t *PubAcks) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Close unsubscribes the reply inbox, stops the sweep (and the disconnect
// watch of [PubAcks.FailOnDisconnect]) and resolves every
// write still pending with [ErrPubAcksClosed]. Later Publish calls fail
// with it. Safe to call more than once.
func (t *PubAcks) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	left := t.pending
	t.pending = nil
	status, statusDone := t.status, t.statusDone
	t.mu.Unlock()
	_ = t.sub.Unsubscribe()
	close(t.stop)
	<-t.done
	if status != nil {
		t.nc.RemoveStatusListener(status)
		<-statusDone
	}
	for _, f := range left {
		f.err = ErrPubAcksClosed
		close(f.done)
	}
}

// reply handles a message on the reply inbox.
func (t *PubAcks) reply(m *nats.Msg) {
	if len(m.Subject) <= len(t.prefix) {
		return
	}
	id, err := strconv.ParseUint(m.Subject[len(t.prefix):], 10, 64)
	if err != nil {
		return
	}
	t.mu.Lock()
	if t.lose != nil && t.lose(id) {
		t.mu.Unlock()
		return
	}
	f := t.pending[id]
	delete(t.pending, id)
	t.mu.Unlock()
	if f == nil {
		return // timed out already, or not ours
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		f.err = jetstream.ErrNoStreamResponse
	} else {
		f.ack, f.err = ParsePubAck(m.Data)
	}
	close(f.done)
}

// sweepLoop resolves timed-out writes every timeout/8 until Close.
func (t *PubAcks) sweepLoop() {
	defer close(t.done)
	tick := time.NewTicker(max(t.timeout/8, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.sweep(now)
		}
	}
}

// sweep resolves the writes sent more than timeout before now with
// [jetstream.ErrAsyncPublishTimeout]. Ids are given out in the order
// writes are sent, so it walks from the oldest pending id and stops at the
// first one still in time.
func (t *PubAcks) sweep(now time.Time) {
	var expired []*PubAckFuture
	t.mu.Lock()
	for ; t.oldest <= t.next && !t.closed; t.oldest++ {
		f, ok := t.pending[t.oldest]
		if !ok {
			continue // resolved
		}
		if now.Sub(f.sent) < t.timeout {
			break
		}
		delete(t.pending, t.oldest)
		expired = append(expired, f)
	}
	t.mu.Unlock()
	for _, f := range expired {
		f.err = jetstream.ErrAsyncPublishTimeout
		close(f.done)
	}
}

// pubAckResponse is the reply to a publish to a stream, as nats.go reads
// it: a PubAck, or an error.
type pubAckResponse struct {
	Error *jetstream.APIError `json:"error,omitempty"`
	*jetstream.PubAck
}

// ParsePubAck reads the reply to a publish to a stream. A flat JSON object
// of string, number and boolean fields (every PubAck the server sends) is
// read from its bytes without allocating; anything else (an error object,
// an escaped string, a field of another kind) goes through encoding/json.
// It returns the PubAck, or the server's *jetstream.APIError for a
// refusal, or [jetstream.ErrInvalidJSAck] for a reply that is neither (not
// JSON, or no stream name).
func ParsePubAck(data []byte) (jetstream.PubAck, error) {
	if ack, ok := parseFlatPubAck(data); ok {
		return ack, nil
	}
	var r pubAckResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return jetstream.PubAck{}, r.Error
	}
	if r.PubAck == nil || r.PubAck.Stream == "" {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	return *r.PubAck, nil
}

// parseFlatPubAck reads a PubAck from a flat JSON object whose values are
// unescaped strings, unsigned integers or booleans, with a non-empty
// "stream" and a "seq". ok is false for anything else, which the caller
// hands to encoding/json. Unknown fields of those kinds are skipped.
func parseFlatPubAck(b []byte) (ack jetstream.PubAck, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return ack, false
	}
	i++
	var seen bool // "seq"
	for first := true; ; first = false {
		i = skipSpace(b, i)
		if i >= len(b) {
			return ack, false
		}
		if b[i] == '}' {
			if first || skipSpace(b, i+1) != len(b) {
				return ack, false // {} or bytes after the object
			}
			break
		}
		if !first {
			if b[i] != ',' {
				return ack, false
			}
			i = skipSpace(b, i+1)
		}
		key, j, ok := flatString(b, i)
		if !ok || foldsToField(key) {
			return ack, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return ack, false
		}
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return ack, false
		}
		switch c := b[i]; {
		case c == '"':
			s, j, ok := flatString(b, i)
			if !ok {
				return ack, false
			}
			i = j
			switch string(key) {
			case "stream":
				ack.Stream = string(s)
			case "domain":
				ack.Domain = string(s)
			case "val":
				ack.Value = string(s)
			case "seq", "duplicate", "error":
				return ack, false
			}
		case c >= '0' && c <= '9':
			j := i
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			if (c == '0' && j-i > 1) || (j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E')) {
				return ack, false // a leading zero (invalid JSON), a fraction or an exponent
			}
			switch string(key) {
			case "seq":
				n, err := strconv.ParseUint(string(b[i:j]), 10, 64)
				if err != nil {
					return ack, false
				}
				ack.Sequence, seen = n, true
			case "stream", "duplicate", "domain", "val", "error":
				return ack, false
			}
			i = j
		case c == 't' || c == 'f':
			v := c == 't'
			lit := "false"
			if v {
				lit = "true"
			}
			if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
				return ack, false
			}
			switch string(key) {
			case "duplicate":
				ack.Duplicate = v
			case "stream", "seq", "domain", "val", "error":
				return ack, false
			}
			i += len(lit)
		default: // an object (an error), an array, null, a negative number
			return ack, false
		}
	}
	if ack.Stream == "" || !seen {
		return jetstream.PubAck{}, false
	}
	return ack, true
}

// pubAckFields are the reply's fields that nats.go reads.
var pubAckFields = [...]string{"stream", "seq", "duplicate", "domain", "val", "error", "type"}

// foldsToField reports whether key is not one of [pubAckFields] exactly
// but matches one case-insensitively, as encoding/json matches names: the
// flat path leaves such a reply to encoding/json.
func foldsToField(key []byte) bool {
	for _, f := range pubAckFields {
		if len(key) == len(f) && string(key) != f && strings.EqualFold(string(key), f) {
			return true
		}
	}
	return false
}

// flatString reads the JSON string starting at b[i] ('"'), without
// escapes: its bytes and the index after its closing quote. ok is false
// for an escape, a control byte or no closing quote.
func flatString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, 0, false // encoding/json reads escapes and non-ASCII (replacing invalid UTF-8)
		}
	}
	return nil, 0, false
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
