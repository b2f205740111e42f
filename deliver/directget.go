package deliver

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// batchReader reads streams by sequence with JetStream's batched direct get
// ($JS.API.DIRECT.GET.<stream>, nats-server 2.11+). It is stateless on the
// server: there is no consumer to create, keep alive or lose while a scanner
// waits two hours for its head, and one request returns a whole batch.
//
// It tells a stored message from a status by the Nats-Sequence header the
// server adds to every stored message, never by a Status header, which a
// publisher could set. For the same reason replies arrive on a channel
// subscription: a synchronous subscription's NextMsg turns any empty
// message with "Status: 503" into an error.
type batchReader struct {
	nc    *nats.Conn
	inbox string // prefix; each request replies to inbox.<n>
	sub   *nats.Subscription
	ch    chan *nats.Msg
	reqID atomic.Uint64
}

func newBatchReader(nc *nats.Conn, maxBatch int) (*batchReader, error) {
	inbox := nc.NewInbox()
	// One request is in flight at a time; room for it and a late one.
	ch := make(chan *nats.Msg, 2*maxBatch+16)
	sub, err := nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe direct-get inbox: %w", err)
	}
	return &batchReader{nc: nc, inbox: inbox, sub: sub, ch: ch}, nil
}

func (r *batchReader) close() { _ = r.sub.Unsubscribe() }

// read appends to dst up to n messages of stream with sequence >= from, at
// most about maxBytes of payload, and returns dst. An empty result means the
// stream holds nothing at or after from. Each returned message keeps
// JetStream's Nats-Sequence, Nats-Subject and Nats-Time-Stamp headers.
func (r *batchReader) read(ctx context.Context, stream string, dst []*nats.Msg, from uint64, n, maxBytes int) ([]*nats.Msg, error) {
	return r.readSubject(ctx, stream, "", dst, from, n, maxBytes)
}

// eachOnSubject calls fn with every message of stream on subject, in
// sequence order, reading n at a time, each read within opTimeout.
func (r *batchReader) eachOnSubject(ctx context.Context, stream, subject string, n int, fn func(m *nats.Msg, seq uint64)) error {
	var buf []*nats.Msg
	for from := uint64(1); ; {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		var err error
		buf, err = r.readSubject(rctx, stream, subject, buf[:0], from, n, 1<<20)
		cancel()
		if err != nil {
			return err
		}
		for _, m := range buf {
			seq, _ := strconv.ParseUint(m.Header.Get(hdrJSSequence), 10, 64)
			from = max(from, seq+1)
			fn(m, seq)
		}
		if len(buf) < n {
			return nil
		}
	}
}

// readSubject is read restricted to messages on subject (a literal subject
// or "" for all), with JetStream's next_by_subj.
func (r *batchReader) readSubject(ctx context.Context, stream, subject string, dst []*nats.Msg, from uint64, n, maxBytes int) ([]*nats.Msg, error) {
	id := r.reqID.Add(1)
	reply := r.inbox + "." + strconv.FormatUint(id, 10)
	var req [160]byte
	b := append(req[:0], `{"seq":`...)
	b = strconv.AppendUint(b, from, 10)
	if subject != "" {
		b = append(b, `,"next_by_subj":`...)
		b = strconv.AppendQuote(b, subject)
	}
	b = append(b, `,"batch":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"max_bytes":`...)
	b = strconv.AppendInt(b, int64(maxBytes), 10)
	b = append(b, '}')
	if err := r.nc.PublishMsg(&nats.Msg{Subject: "$JS.API.DIRECT.GET." + stream, Reply: reply, Data: b}); err != nil {
		return dst, fmt.Errorf("direct get: %w", err)
	}
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return dst, fmt.Errorf("direct get: %w", ctx.Err())
		case m = <-r.ch:
		}
		if m.Subject != reply {
			continue // a late reply to an earlier, abandoned request
		}
		if m.Header.Get(hdrJSSequence) == "" {
			// A status, not a message: every stored message comes back with
			// Nats-Sequence, and level messages carry no user Nats-* header.
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
