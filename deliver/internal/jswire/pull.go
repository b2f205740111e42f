package jswire

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	// PullExpires is how long the server keeps each pull request.
	PullExpires = 30 * time.Second
	// PullHeartbeat is the idle heartbeat each pull request asks for. With
	// no message at all for twice this long, the requests are taken as lost
	// and asked again: a consumer whose leader hung is asked again, and
	// reached at its new leader, within two of them after the election.
	PullHeartbeat = time.Second
)

// Pull pulls a consumer over the JetStream wire protocol, keeping about
// batch messages requested ahead. The consumer is any pull consumer: durable
// or ephemeral, with any ack policy; Pull only reads.
//
// It tells a data message from a status message by its reply subject: data
// always carries a $JS.ACK.… reply, the server's status messages never do.
// A publisher's message that imitates a status (user headers "Status: 409",
// "Description: Consumer Deleted") is data.
//
// Pull is owned by one goroutine: [Pull.Next] must not be called
// concurrently. [Pull.Stop] may be called from any goroutine, once or more.
type Pull struct {
	nc          *nats.Conn
	subject     string // $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
	inbox       string
	sub         *nats.Subscription
	ch          chan *nats.Msg
	heartbeat   time.Duration
	timer       *time.Timer
	batch       int
	outstanding int // messages requested and not yet received or voided
	request     []byte
	lastSeen    time.Time
	reasked     bool // asked again for a silence, and nothing came since
	failSilent  bool // FailUnanswered
	reconnects  uint64
	reconnLook  time.Time
}

// FailUnanswered makes [Pull.Next] return [ErrNoHeartbeat] when the
// requests asked again after a silence (no message or heartbeat for twice
// [PullHeartbeat]) go unanswered for as long again: the consumer's server
// may hang, and a caller that can place the consumer elsewhere (an R1
// consumer) does so instead of asking it for ever. Call it before the
// first Next.
func (p *Pull) FailUnanswered() { p.failSilent = true }

// NewPull subscribes an inbox for consumer on stream and returns a Pull
// that will request batch messages at a time (batch > 0), each request at
// most maxBytes of payload (0: no limit; it must leave room for the largest
// message the stream holds, or that message can never be pulled). No
// request is sent before the first [Pull.Next]. The error is the
// subscription's.
func NewPull(nc *nats.Conn, stream, consumer string, batch, maxBytes int) (*Pull, error) {
	return newPull(nc, stream, consumer, batch, maxBytes, PullExpires, PullHeartbeat)
}

func newPull(nc *nats.Conn, stream, consumer string, batch, maxBytes int, expires, heartbeat time.Duration) (*Pull, error) {
	inbox := nc.NewInbox()
	// At most 1.5 batches are requested ahead, plus status messages. A
	// channel subscription, because a synchronous one's NextMsg turns an
	// empty message with a publisher's "Status: 503" into an error.
	ch := make(chan *nats.Msg, 4*batch+64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe pull inbox: %w", err)
	}
	req := fmt.Appendf(nil, `{"batch":%d,"expires":%d,"idle_heartbeat":%d`, batch, expires.Nanoseconds(), heartbeat.Nanoseconds())
	if maxBytes > 0 {
		req = fmt.Appendf(req, `,"max_bytes":%d`, maxBytes)
	}
	req = append(req, '}')
	return &Pull{
		nc: nc, subject: "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
		inbox: inbox, sub: sub, ch: ch, heartbeat: heartbeat, timer: time.NewTimer(heartbeat),
		batch: batch, request: req, lastSeen: time.Now(), reconnects: nc.Stats().Reconnects,
	}, nil
}

// Stop unsubscribes the inbox: the server's requests lapse, and Next
// returns nothing more that was not already buffered. Safe from any
// goroutine.
func (p *Pull) Stop() { _ = p.sub.Unsubscribe() }

// Next returns the next data message, its reply subject a $JS.ACK subject
// ([ParseAck] reads it). It sends pull requests as needed: when the
// requests outstanding fall to half a batch, after a reconnect, after a
// status says a request is void, and when no message or heartbeat came for
// twice [PullHeartbeat] (with [Pull.FailUnanswered], once: the second
// time it returns [ErrNoHeartbeat]).
//
// With block unset it returns (nil, nil) at once when no message is
// buffered. With block set it waits: for a message; for timeout, if
// positive, then (nil, nil); for wake, then [ErrWoken]. It returns ctx's
// error when ctx is done, [ErrConsumerDeleted] when the consumer is gone,
// and a wrapped error when a pull request cannot be published.
func (p *Pull) Next(ctx context.Context, wake <-chan struct{}, block bool, timeout time.Duration) (*nats.Msg, error) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if now := time.Now(); now.Sub(p.reconnLook) > 100*time.Millisecond {
			p.reconnLook = now
			if r := p.nc.Stats().Reconnects; r != p.reconnects {
				// The server may have forgotten our requests across the reconnect.
				p.reconnects, p.outstanding = r, 0
				p.lastSeen, p.reasked = now, false // the silence counts from the requests sent again
			}
		}
		if p.outstanding <= p.batch/2 {
			if err := p.nc.PublishRequest(p.subject, p.inbox, p.request); err != nil {
				return nil, fmt.Errorf("pull request: %w", err)
			}
			p.outstanding += p.batch
		}
		var m *nats.Msg
		select {
		case m = <-p.ch:
		default:
			if !block {
				return nil, nil
			}
			// The silence is counted from the last message read, across
			// calls: a caller whose waits are shorter than a heartbeat
			// notices it too.
			wait := time.Until(p.lastSeen.Add(2 * p.heartbeat))
			if wait <= 0 {
				if err := p.silence(); err != nil {
					return nil, err
				}
				continue
			}
			p.timer.Reset(wait)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-wake:
				return nil, ErrWoken
			case <-deadline:
				return nil, nil
			case <-p.timer.C:
				continue // the silence, checked above
			case m = <-p.ch:
			}
		}
		p.lastSeen, p.reasked = time.Now(), false
		sig := classify(m, p.batch)
		switch sig.kind {
		case sigData:
			p.outstanding--
			return m, nil
		case sigForeign:
			continue
		case sigDeleted:
			return nil, ErrConsumerDeleted
		case sigIdle:
		case sigVoid:
			p.outstanding -= sig.unsent
		case sigReset:
			p.outstanding = 0
		case sigRefused:
			p.outstanding -= sig.unsent
			// If it recurs at once (an operator's request limits), do
			// not re-pull in a tight loop.
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return nil, err
			}
		}
		p.outstanding = max(p.outstanding, 0)
	}
}

// silence handles twice the heartbeat without a message: the requests
// are gone; ask again. With FailUnanswered, a silence after the requests
// were asked again returns [ErrNoHeartbeat].
func (p *Pull) silence() error {
	if p.failSilent && p.reasked {
		return ErrNoHeartbeat
	}
	p.outstanding, p.lastSeen, p.reasked = 0, time.Now(), true
	return nil
}

// signalKind is what one message on a pull inbox means to the pull loop.
type signalKind uint8

const (
	sigIdle    signalKind = iota // status 100 (idle heartbeat), or a status the loop has no use for
	sigData                      // a data message: its reply is a $JS.ACK subject
	sigForeign                   // a message with some other reply subject: not the server's, ignored
	sigDeleted                   // 503 no responders, or 409 Consumer Deleted: the consumer is gone
	sigVoid                      // 404 No Messages, 408 Request Timeout, 409 Batch Completed: unsent messages of one request
	sigReset                     // 409 Leadership Change or Server Shutdown: every request is gone
	sigRefused                   // any other 409 (Exceeded MaxWaiting, Exceeded MaxRequestBatch…): one request refused
)

// signal is a classified pull-inbox message.
type signal struct {
	kind   signalKind
	unsent int // sigVoid, sigRefused: the request's messages the server will not send
}

// classify says what m, received on a pull inbox, means. A message is data
// by its $JS.ACK reply subject alone, whatever its headers; a status is
// read only from a message with no reply subject, as the server sends them.
// batch is the request size, the unsent count of a void request whose
// status does not say.
func classify(m *nats.Msg, batch int) signal {
	if strings.HasPrefix(m.Reply, AckPrefix) {
		return signal{kind: sigData}
	}
	if m.Reply != "" {
		return signal{kind: sigForeign}
	}
	switch m.Header.Get("Status") {
	case "503": // no responders: the consumer is gone
		return signal{kind: sigDeleted}
	case "404", "408": // no messages / request expired: the rest of it is void
		return signal{kind: sigVoid, unsent: pendingOf(m, batch)}
	case "409":
		descr := strings.ToLower(m.Header.Get("Description"))
		switch {
		case strings.Contains(descr, "consumer deleted"):
			return signal{kind: sigDeleted}
		case strings.Contains(descr, "leadership change"), strings.Contains(descr, "server shutdown"):
			return signal{kind: sigReset}
		case strings.Contains(descr, "batch completed"): // routine: a request was filled
			return signal{kind: sigVoid, unsent: pendingOf(m, 0)}
		default: // exceeded max waiting, max request batch…: that request is void
			return signal{kind: sigRefused, unsent: pendingOf(m, batch)}
		}
	}
	return signal{kind: sigIdle} // "100": idle heartbeat or flow control
}

// pendingOf reads how many messages a status says were left unsent
// (Nats-Pending-Messages), dflt if it does not say.
func pendingOf(m *nats.Msg, dflt int) int {
	if v := m.Header.Get("Nats-Pending-Messages"); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return dflt
}

// sleepCtx waits d, or until ctx is done (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
