package deliver

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// batchReader reads a stream by sequence with JetStream's batched direct get
// ($JS.API.DIRECT.GET.<stream>, nats-server 2.11+). It is stateless on the
// server: there is no consumer to create, keep alive or lose while a scanner
// waits two hours for its head, and one request returns a whole batch.
type batchReader struct {
	nc      *nats.Conn
	subject string // $JS.API.DIRECT.GET.<stream>
	inbox   string // prefix; each request replies to inbox.<n>
	sub     *nats.Subscription
	reqID   atomic.Uint64
}

func newBatchReader(nc *nats.Conn, stream string) (*batchReader, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		return nil, fmt.Errorf("subscribe direct-get inbox: %w", err)
	}
	// A burst batch is many messages; never drop them as a slow consumer.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	return &batchReader{nc: nc, subject: "$JS.API.DIRECT.GET." + stream, inbox: inbox, sub: sub}, nil
}

func (r *batchReader) close() { _ = r.sub.Unsubscribe() }

// read appends to dst up to n messages with sequence >= from, at most about
// maxBytes of payload, and returns dst. An empty result means the stream
// holds nothing at or after from. Each returned message keeps JetStream's
// Nats-Sequence, Nats-Subject and Nats-Time-Stamp headers.
func (r *batchReader) read(ctx context.Context, dst []*nats.Msg, from uint64, n, maxBytes int) ([]*nats.Msg, error) {
	id := r.reqID.Add(1)
	reply := r.inbox + "." + strconv.FormatUint(id, 10)
	var req [96]byte
	b := append(req[:0], `{"seq":`...)
	b = strconv.AppendUint(b, from, 10)
	b = append(b, `,"batch":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"max_bytes":`...)
	b = strconv.AppendInt(b, int64(maxBytes), 10)
	b = append(b, '}')
	if err := r.nc.PublishMsg(&nats.Msg{Subject: r.subject, Reply: reply, Data: b}); err != nil {
		return dst, fmt.Errorf("direct get: %w", err)
	}
	for {
		m, err := r.sub.NextMsgWithContext(ctx)
		if err != nil {
			return dst, fmt.Errorf("direct get: %w", err)
		}
		if m.Subject != reply {
			continue // a late reply to an earlier, abandoned request
		}
		if m.Header.Get(hdrJSSequence) == "" {
			// A status, not a message: every stored message comes back with
			// Nats-Sequence, and level messages carry no user Nats-* header,
			// so a publisher's own "Status" header cannot pose as one.
			switch m.Header.Get("Status") {
			case "204", "404": // end of batch; nothing at or after from
				return dst, nil
			case "503":
				return dst, fmt.Errorf("direct get: %w", nats.ErrNoResponders)
			default:
				return dst, fmt.Errorf("direct get: unexpected reply: status %q %s", m.Header.Get("Status"), m.Header.Get("Description"))
			}
		}
		dst = append(dst, m)
	}
}
