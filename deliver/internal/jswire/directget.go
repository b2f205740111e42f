package jswire

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/internal/hedge"
)

// HeaderSequence is the header JetStream adds to every message a direct
// get returns: its stream sequence, in decimal.
const HeaderSequence = "Nats-Sequence"

// BatchReader reads streams by sequence with JetStream's batched direct get
// ($JS.API.DIRECT.GET.<stream>, nats-server 2.11+; the stream needs
// AllowDirect). It is stateless on the server: there is no consumer to
// create, keep alive or lose while a reader waits hours between reads, and
// one request returns a whole batch. Any replica of the stream may answer a
// read, and one that hangs never does: a read not answered within
// hedge.After is sent again ([BatchReader.ReadSubject]).
//
// It tells a stored message from a status by the Nats-Sequence header the
// server adds to every stored message, never by a Status header, which a
// publisher could set.
//
// A BatchReader is owned by one goroutine at a time: its reads share one
// inbox subscription, and a read discards replies to any other request, so
// two concurrent reads would lose each other's messages. [BatchReader.Close]
// may be called from any goroutine.
type BatchReader struct {
	nc    *nats.Conn
	inbox string // prefix; each request replies to inbox.<n>
	sub   *nats.Subscription
	ch    chan *nats.Msg
	reqID atomic.Uint64

	maxBatch int
	tries    atomic.Uint64       // requests sent, every try counted (lose)
	lose     func(n uint64) bool // tests: drop every reply to try n (LoseReplies)
}

// LoseReplies makes the reader drop every reply to its n-th request (n
// counting every try of every read from 1) when lose(n) is true, as if a
// replica that hangs had it: the request is sent, and its answer never
// reaches the read. For fault tests; call it before the first read.
func (r *BatchReader) LoseReplies(lose func(n uint64) bool) { r.lose = lose }

// NewBatchReader subscribes an inbox for reads of up to maxBatch messages
// each (larger reads work, but replies beyond the buffer are dropped by the
// client as a slow consumer). The error is the subscription's.
func NewBatchReader(nc *nats.Conn, maxBatch int) (*BatchReader, error) {
	inbox := nc.NewInbox()
	// One request is in flight at a time; room for it and a late one.
	// (A read's resends have their own inboxes: [BatchReader.ReadSubject].)
	ch := make(chan *nats.Msg, 2*maxBatch+16)
	sub, err := nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe direct-get inbox: %w", err)
	}
	return &BatchReader{nc: nc, inbox: inbox, sub: sub, ch: ch, maxBatch: maxBatch}, nil
}

// Close unsubscribes the inbox.
func (r *BatchReader) Close() { _ = r.sub.Unsubscribe() }

// Read appends to dst up to n messages of stream with sequence >= from, in
// sequence order, at most about maxBytes of payload, and returns dst. Fewer
// than n means the stream holds no more at or after from, or maxBytes was
// reached. Each returned message keeps JetStream's Nats-Sequence
// ([HeaderSequence]), Nats-Subject and Nats-Time-Stamp headers.
//
// Errors: ctx's error, wrapped, when ctx is done before the batch ends (dst
// then holds what came); [nats.ErrNoResponders], wrapped, when no server
// answers (no such stream, or it does not allow direct gets); a status
// error for any other status reply.
func (r *BatchReader) Read(ctx context.Context, stream string, dst []*nats.Msg, from uint64, n, maxBytes int) ([]*nats.Msg, error) {
	return r.ReadSubject(ctx, stream, "", dst, from, n, maxBytes)
}

// EachOnSubject calls fn with every message of stream on subject and its
// stream sequence, in sequence order, reading n at a time (n > 0, at most
// 1 MiB of messages a read), each read within perRead. It reads on until
// the server counts no more matching messages (Nats-Num-Pending 0), so a
// page cut short by its 1 MiB does not end the walk. It returns the first read's error, wrapped as by
// [BatchReader.Read]; fn may have seen messages by then.
func (r *BatchReader) EachOnSubject(ctx context.Context, stream, subject string, n int, perRead time.Duration, fn func(m *nats.Msg, seq uint64)) error {
	return r.EachOnSubjectPaced(ctx, stream, subject, n, perRead, nil, fn)
}

// EachOnSubjectPaced is [BatchReader.EachOnSubject] with pace called
// before each read: the read waits for it, and calls the func it returns
// when the read is done (so a caller can spread the server's work over
// time). pace's error ends the walk and is returned as is. A nil pace
// paces nothing.
func (r *BatchReader) EachOnSubjectPaced(ctx context.Context, stream, subject string, n int, perRead time.Duration, pace func(context.Context) (func(), error), fn func(m *nats.Msg, seq uint64)) error {
	var buf []*nats.Msg
	for from := uint64(1); ; {
		done := func() {}
		if pace != nil {
			var err error
			if done, err = pace(ctx); err != nil {
				return err
			}
		}
		rctx, cancel := context.WithTimeout(ctx, perRead)
		var err error
		buf, err = r.ReadSubject(rctx, stream, subject, buf[:0], from, n, 1<<20)
		cancel()
		done()
		if err != nil {
			return err
		}
		for _, m := range buf {
			seq, _ := strconv.ParseUint(m.Header.Get(HeaderSequence), 10, 64)
			from = max(from, seq+1)
			fn(m, seq)
		}
		if len(buf) == 0 {
			return nil
		}
		// A page ends short of n at the end of the subject, or at the
		// read's 1 MiB: the last message's Nats-Num-Pending (the matching
		// messages after it, as the server counted them) tells which.
		if np, err := strconv.ParseUint(buf[len(buf)-1].Header.Get(headerNumPending), 10, 64); err == nil {
			if np == 0 {
				return nil
			}
			continue
		}
		if len(buf) < n {
			return nil
		}
	}
}

// headerNumPending is the header of a batched direct get's message that
// counts the messages matching the request after it.
const headerNumPending = "Nats-Num-Pending"

// ReadSubject is [BatchReader.Read] restricted to messages on subject (a
// literal subject, or "" for all), with JetStream's next_by_subj.
func (r *BatchReader) ReadSubject(ctx context.Context, stream, subject string, dst []*nats.Msg, from uint64, n, maxBytes int) ([]*nats.Msg, error) {
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
	// Any replica of the stream may answer, and one that hangs never does:
	// a read not answered within hedge.After is sent again, every
	// hedge.After up to readTries in all, and the first try to answer is
	// the one read. The first try replies to the shared inbox; each resend
	// to an inbox of its own, unsubscribed when the read ends, so that a
	// hung server's answers when it resumes reach no one (the shared
	// inbox's buffer has room for one late answer, not for many).
	replies := make([]string, 0, 2)
	var (
		resent chan *nats.Msg // the resends' answers; nil until the first resend
		subs   []*nats.Subscription
	)
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	send := func(reply string) error {
		if r.lose != nil && r.lose(r.tries.Add(1)) {
			replies = append(replies, "") // no reply has an empty subject: this try's reach no one
		} else {
			replies = append(replies, reply)
		}
		if err := r.nc.PublishMsg(&nats.Msg{Subject: "$JS.API.DIRECT.GET." + stream, Reply: reply, Data: b}); err != nil {
			return fmt.Errorf("direct get: %w", err)
		}
		return nil
	}
	if err := send(r.inbox + "." + strconv.FormatUint(r.reqID.Add(1), 10)); err != nil {
		return dst, err
	}
	resend := time.NewTimer(hedge.After)
	defer resend.Stop()
	reply := "" // the try being read, once one answered
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return dst, fmt.Errorf("direct get: %w", ctx.Err())
		case <-resend.C:
			if reply == "" && len(replies) < readTries {
				if resent == nil {
					resent = make(chan *nats.Msg, 2*r.maxBatch+16)
				}
				inbox := r.nc.NewInbox()
				sub, err := r.nc.ChanSubscribe(inbox, resent)
				if err != nil {
					return dst, fmt.Errorf("direct get: subscribe: %w", err)
				}
				subs = append(subs, sub)
				if err := send(inbox); err != nil {
					return dst, err
				}
				resend.Reset(hedge.After)
			}
			continue
		case m = <-r.ch:
		case m = <-resent:
		}
		if reply == "" && slices.Contains(replies, m.Subject) {
			reply = m.Subject
		}
		if m.Subject != reply {
			continue // a reply to another try, or to an earlier, abandoned read
		}
		if m.Header.Get(HeaderSequence) == "" {
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

// readTries bounds the tries of one read: the first and its resends (at
// hedge.After, 8 s of them).
const readTries = 16
