package deliver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Ack bodies of the JetStream consumer protocol.
var (
	ackAck        = []byte("+ACK")
	ackInProgress = []byte("+WPI")
	ackTerm       = []byte("+TERM")
)

const (
	pullExpires   = 30 * time.Second
	pullHeartbeat = 5 * time.Second
	ackPrefix     = "$JS.ACK."
)

// errConsumerDeleted means the server deleted the pull consumer.
var errConsumerDeleted = errors.New("consumer deleted")

// pullLoop pulls a durable consumer over the JetStream wire protocol, keeping
// about batch messages requested ahead.
//
// It tells a data message from a status message by its reply subject: data
// always carries a $JS.ACK.… reply, the server's status messages never do.
// Client libraries that look at the Status header instead can be poisoned by
// a publisher: an empty message with a user header "Status: 409" and
// "Description: Consumer Deleted" reads as the consumer's deletion.
type pullLoop struct {
	nc          *nats.Conn
	subject     string // $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
	inbox       string
	sub         *nats.Subscription
	ch          chan *nats.Msg
	timer       *time.Timer
	batch       int
	outstanding int
	request     []byte
	lastSeen    time.Time
	reconnects  uint64
	reconnLook  time.Time
}

func newPullLoop(nc *nats.Conn, stream, consumer string, batch, maxBytes int) (*pullLoop, error) {
	inbox := nc.NewInbox()
	// At most 1.5 batches are requested ahead, plus status messages. A
	// channel subscription, because a synchronous one's NextMsg turns an
	// empty message with a publisher's "Status: 503" into an error.
	ch := make(chan *nats.Msg, 4*batch+64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe pull inbox: %w", err)
	}
	req := fmt.Appendf(nil, `{"batch":%d,"expires":%d,"idle_heartbeat":%d`, batch, pullExpires.Nanoseconds(), pullHeartbeat.Nanoseconds())
	if maxBytes > 0 {
		req = fmt.Appendf(req, `,"max_bytes":%d`, maxBytes)
	}
	req = append(req, '}')
	return &pullLoop{
		nc: nc, subject: "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer,
		inbox: inbox, sub: sub, ch: ch, timer: time.NewTimer(pullHeartbeat),
		batch: batch, request: req, lastSeen: time.Now(), reconnects: nc.Stats().Reconnects,
	}, nil
}

// stop ends the loop.
func (p *pullLoop) stop() { _ = p.sub.Unsubscribe() }

// errWoken is returned by next when its wake channel fired.
var errWoken = errors.New("woken")

// next returns the next data message. It returns errWoken when wake fires,
// and an error when ctx is done or the consumer was deleted. With block
// unset it returns a nil message at once when none is buffered; with a
// positive timeout it returns a nil message once that long has passed.
func (p *pullLoop) next(ctx context.Context, wake <-chan struct{}, block bool, timeout time.Duration) (*nats.Msg, error) {
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
			p.timer.Reset(pullHeartbeat)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-wake:
				return nil, errWoken
			case <-deadline:
				return nil, nil
			case <-p.timer.C:
				if time.Since(p.lastSeen) > 2*pullHeartbeat {
					// No heartbeat: the requests are gone; ask again.
					p.outstanding, p.lastSeen = 0, time.Now()
				}
				continue
			case m = <-p.ch:
			}
		}
		p.lastSeen = time.Now()
		if strings.HasPrefix(m.Reply, ackPrefix) {
			p.outstanding--
			return m, nil
		}
		if m.Reply != "" {
			continue // not ours
		}
		switch m.Header.Get("Status") {
		case "503": // no responders: the consumer is gone
			return nil, errConsumerDeleted
		case "100": // idle heartbeat or flow control
		case "404", "408": // no messages / request expired: the rest of it is void
			p.outstanding -= pendingOf(m, p.batch)
		case "409":
			descr := strings.ToLower(m.Header.Get("Description"))
			switch {
			case strings.Contains(descr, "consumer deleted"):
				return nil, errConsumerDeleted
			case strings.Contains(descr, "leadership change"), strings.Contains(descr, "server shutdown"):
				p.outstanding = 0
			case strings.Contains(descr, "batch completed"): // routine: a request was filled
				p.outstanding -= pendingOf(m, 0)
			default: // exceeded max waiting, max request batch…: that request is void
				p.outstanding -= pendingOf(m, p.batch)
				// If it recurs at once (an operator's request limits), do
				// not re-pull in a tight loop.
				if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
					return nil, err
				}
			}
		}
		p.outstanding = max(p.outstanding, 0)
	}
}

// pendingOf reads how many messages a status says were left unsent.
func pendingOf(m *nats.Msg, dflt int) int {
	if v := m.Header.Get("Nats-Pending-Messages"); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return dflt
}

// ackMeta holds the fields of a $JS.ACK reply subject delayd uses.
type ackMeta struct {
	streamSeq uint64
	stored    time.Time
	delivered uint64
}

// parseAck parses "$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>"
// and the v2 form with domain, account hash and a trailing token.
func parseAck(reply string) (ackMeta, bool) {
	rest, ok := strings.CutPrefix(reply, ackPrefix)
	if !ok {
		return ackMeta{}, false
	}
	var tok [12]string
	n := 0
	for n < len(tok) {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			tok[n] = rest
			n++
			break
		}
		tok[n], rest = rest[:i], rest[i+1:]
		n++
	}
	var f []string
	switch n {
	case 7: // v1: stream consumer delivered sseq dseq ts pending
		f = tok[2:7]
	case 9, 10: // v2: domain acchash stream consumer delivered sseq dseq ts pending [token]
		f = tok[4:9]
	default:
		return ackMeta{}, false
	}
	delivered, err1 := strconv.ParseUint(f[0], 10, 64)
	sseq, err2 := strconv.ParseUint(f[1], 10, 64)
	ts, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return ackMeta{}, false
	}
	return ackMeta{streamSeq: sseq, stored: time.Unix(0, ts), delivered: delivered}, true
}
