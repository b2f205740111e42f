package cancelapi

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/levels"
)

// The list API's limits (docs/pending.md#14-request-and-answer).
const (
	// listQueueMax is how many list requests wait for a list worker at
	// most; one more is answered busy (429) at once.
	listQueueMax = 32
	// listWorkers walk at a time: a slow walk holds up no cancel.
	listWorkers = 2
	// listWait bounds a walk's wait for the paced reads: a page spread
	// over a large stream needs seconds of the shared budget.
	listWait = 10 * time.Second
	// listBatch is the most messages one read of a walk asks for.
	listBatch = 32
	// listReplySlack is kept free below the connection's max payload for
	// the reply's headers and the JSON around the items.
	listReplySlack = 4 << 10
)

// errBadList wraps a list request's errors that are the request's fault
// (code 400).
var errBadList = errors.New("bad list request")

// listQuery is one parsed list request.
type listQuery struct {
	target        string
	limit         int
	after, before time.Time // exclusive bounds on due; zero: none
	payload       bool
	cur           listCursor
}

// listCursor is the position a page ends at, sent to the client as the
// reply's next (base64url of its JSON, opaque to clients): every item
// before (D, K) in (due, key) order was returned, and every item of
// stream s below S[s] was returned or is excluded
// (docs/pending.md#13-the-walk-top-k-by-final-due-with-a-per-stream-lower-bound).
type listCursor struct {
	D int64             `json:"d"`
	K string            `json:"k"`
	S map[string]uint64 `json:"s,omitempty"`
}

func (c listCursor) set() bool { return c.K != "" }

// after reports whether (due, key) comes after the cursor's position.
func (c listCursor) after(due time.Time, key string) bool {
	if !c.set() {
		return true
	}
	return cmp.Or(cmp.Compare(due.UnixNano(), c.D), strings.Compare(key, c.K)) > 0
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // cannot fail: numbers and strings
	return base64.RawURLEncoding.EncodeToString(b)
}

// errListBusy is a list's busy answer (code 429, as the cancel API's
// [level.ErrCancelBusy], which it matches with errors.Is): the list queue
// is full, or the walk could not get its reads in time.
var errListBusy error = listBusy{}

type listBusy struct{}

func (listBusy) Error() string        { return "busy: too many list requests waiting; try again" }
func (listBusy) Is(target error) bool { return target == level.ErrCancelBusy }

// parseList parses a request on "delayd.api.pending.<target>"; prefix is
// the ingress prefix (a target under it is refused, as a publish to it
// is: [contract.ValidateTarget]).
func parseList(target, prefix string, data []byte) (listQuery, error) {
	q := listQuery{target: target, limit: contract.PendingLimitDefault}
	if err := contract.ValidateTarget(target, prefix); err != nil {
		return q, fmt.Errorf("%w: %w", errBadList, err)
	}
	var req contract.PendingRequest
	if len(strings.TrimSpace(string(data))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields() // a misspelt option is refused, not ignored
		if err := dec.Decode(&req); err != nil {
			return q, fmt.Errorf("%w: payload is not a JSON list request: %w", errBadList, err)
		}
		if dec.More() {
			return q, fmt.Errorf("%w: payload is not a JSON list request: data after its JSON object", errBadList)
		}
	}
	switch {
	case req.Limit < 0 || req.Limit > contract.PendingLimitMax:
		return q, fmt.Errorf("%w: limit %d is not in 1..%d", errBadList, req.Limit, contract.PendingLimitMax)
	case req.Limit > 0:
		q.limit = req.Limit
	}
	if req.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(req.Cursor)
		if err == nil {
			err = json.Unmarshal(b, &q.cur)
		}
		if err != nil {
			return q, fmt.Errorf("%w: cursor is not a next this API gave", errBadList)
		}
	}
	q.after, q.before, q.payload = req.DueAfter, req.DueBefore, req.Payload
	return q, nil
}

// candidate is a level message read by a walk, pending when sifted.
type candidate struct {
	item contract.PendingItem
	key  string // its index key: ties of due are ordered by it
	ref  string // its first ingress reference (Delayd-Origin, else Delayd-Ingress)
	hop  bool   // its placement ends in a hop (Delayd-Hop-Due), not a delivery
}

func (c *candidate) less(o *candidate) bool {
	return cmp.Or(c.item.Due.Compare(o.item.Due), strings.Compare(c.key, o.key)) < 0
}

// topK is a max-heap of the limit lowest candidates by (due, key).
type topK []*candidate

func (h topK) Len() int           { return len(h) }
func (h topK) Less(i, j int) bool { return h[j].less(h[i]) }
func (h topK) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *topK) Push(x any)        { *h = append(*h, x.(*candidate)) }
func (h *topK) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// streamWalk is one level stream's part of a walk.
type streamWalk struct {
	name    string
	level   time.Duration // the level's delay
	rmin    time.Duration // the least remaining delay a message placed there had
	bounded bool          // false: level 0, read to the end
	last    uint64        // the last sequence read
	resume  uint64        // the lowest sequence of a candidate not kept (0: none)
	stopped bool          // stopped before the end by the lower bound
}

// walk lists one page of q.target's pending messages: each level stream
// is read by subject from the cursor (or from past its owner's passed),
// each read batch's sequences are sifted by the owner, and a stream is read
// only until no unread message of it can be due before the page's last
// (bound: docs/pending.md#13-the-walk-top-k-by-final-due-with-a-per-stream-lower-bound).
// It returns the reply.
func (a *worker) walk(ctx context.Context, reader *jswire.BatchReader, q listQuery, notAfter time.Time) (contract.PendingReply, error) {
	reply, _, err := a.walkPage(ctx, reader, q, notAfter)
	return reply, err
}

// walkPage is [API.walk] that also returns the page's candidates, one per
// item of the reply, in its order.
func (a *worker) walkPage(ctx context.Context, reader *jswire.BatchReader, q listQuery, notAfter time.Time) (contract.PendingReply, []*candidate, error) {
	// Every message published before the request is in a level stream
	// once the router has acked it.
	switch caughtUp, err := a.routed.wait(ctx); {
	case err != nil:
		return contract.PendingReply{}, nil, err
	case !caughtUp:
		return contract.PendingReply{}, nil, ErrRouterBehind
	}
	k := &walker{q: q, walks: make(map[string]*streamWalk)}
	for _, name := range walkOrder(a.cfg.Decider.Streams()) {
		w := a.streamWalk(name)
		k.walks[name] = w
		if err := a.walkStream(ctx, reader, k, w, notAfter); err != nil {
			return contract.PendingReply{}, nil, err
		}
	}
	return a.page(ctx, k)
}

// walkOrder returns the level streams in the order a walk reads them:
// longest delay first (partitions of one level by name), level 0 last. A
// message only cascades to a shorter level, so one that moves after its
// stream was read lands in a stream read later and is listed there; read
// the other way, it would be missed.
func walkOrder(streams []string) []string {
	out := slices.Clone(streams)
	delay := func(name string) time.Duration {
		d, _, _ := levels.ParseStream(name) // not a level stream: 0, with level 0
		return d
	}
	slices.SortStableFunc(out, func(x, y string) int {
		return cmp.Or(cmp.Compare(delay(y), delay(x)), strings.Compare(x, y))
	})
	return out
}

// walker is one walk's state: the candidates kept and the streams'.
type walker struct {
	q     listQuery
	h     topK
	walks map[string]*streamWalk
}

// keep offers c for the page: past the limit, the last candidate by
// (due, key) is dropped, and its stream is read again from it on the next
// page.
func (k *walker) keep(c *candidate) {
	heap.Push(&k.h, c)
	if k.h.Len() > k.q.limit {
		k.notReturned(heap.Pop(&k.h).(*candidate))
	}
}

// notReturned records that c was read and is not on this page.
func (k *walker) notReturned(c *candidate) {
	if w := k.walks[c.item.Stream]; w.resume == 0 || c.item.Seq < w.resume {
		w.resume = c.item.Seq
	}
}

// streamWalk returns the walk state of level stream name.
func (a *worker) streamWalk(name string) *streamWalk {
	w := &streamWalk{name: name}
	d, _, ok := levels.ParseStream(name)
	if !ok || d == 0 {
		return w // level 0 holds what is due now: read it to the end
	}
	w.level, w.rmin, w.bounded = d, d, true
	// Without precision levels, a remaining delay of 1 ms or more below
	// the shortest level is placed in the shortest level.
	if all := a.cfg.Levels.Levels(); !a.cfg.Levels.Precision() && len(all) > 0 && d == all[0].Delay {
		w.rmin = 0
	}
	return w
}

// walkStream reads w's stream for q, keeping candidates in h.
func (a *worker) walkStream(ctx context.Context, reader *jswire.BatchReader, k *walker, w *streamWalk, notAfter time.Time) error {
	q := k.q
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(w.name, levels.StreamPrefix) + "." + q.target
	levelName := levels.FormatDuration(w.level)
	from := max(q.cur.S[w.name], 1)
	// One message first: a stream without the target's messages costs the
	// server one subject lookup, and its owner is not asked.
	buf, err := a.readPaced(ctx, reader, w.name, subject, nil, from, 1, notAfter)
	if errors.Is(err, nats.ErrNoResponders) {
		// The stream is gone (a drained level deleted: nothing waits
		// there), or no server answers for it (an error).
		ictx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		_, serr := a.cfg.JS.Stream(ictx, w.name)
		cancel()
		if errors.Is(serr, jetstream.ErrStreamNotFound) {
			return nil
		}
	}
	if err != nil || len(buf) == 0 {
		return err
	}
	sifted, err := a.cfg.Decider.Sift(ctx, w.name, nil)
	if err != nil {
		return err
	}
	from = max(from, sifted.Passed+1)
	n := min(q.limit+1, listBatch)
	for {
		if buf, err = a.readPaced(ctx, reader, w.name, subject, buf[:0], from, n, notAfter); err != nil {
			return err
		}
		if len(buf) == 0 {
			return nil
		}
		seqs := make([]uint64, 0, len(buf))
		for _, m := range buf {
			seq, _ := strconv.ParseUint(m.Header.Get(jswire.HeaderSequence), 10, 64)
			seqs = append(seqs, seq)
		}
		if sifted, err = a.cfg.Decider.Sift(ctx, w.name, seqs); err != nil {
			return err
		}
		for i, m := range buf {
			seq := seqs[i]
			from, w.last = seq+1, seq
			if c, ok := a.decodeCandidate(m, seq, w.name, levelName, q); ok && sifted.Pending(seq) && q.cur.after(c.item.Due, c.key) && inFilter(q, c.item.Due) {
				k.keep(c)
			}
			if !w.bounded {
				continue
			}
			levelDue, ok := message.LevelDue(m.Header)
			if !ok {
				continue
			}
			// No unread message of the stream is due before bound.
			bound := levelDue.Add(w.rmin - w.level)
			if !q.before.IsZero() && !bound.Before(q.before) {
				return nil
			}
			if k.h.Len() == q.limit && bound.After(k.h[0].item.Due) {
				w.stopped = true
				return nil
			}
		}
	}
}

func inFilter(q listQuery, due time.Time) bool {
	return (q.after.IsZero() || due.After(q.after)) && (q.before.IsZero() || due.Before(q.before))
}

// readPaced reads up to n messages of stream on subject from from, paced
// by the lookup pacer as the cancel API's lookups are.
func (a *worker) readPaced(ctx context.Context, reader *jswire.BatchReader, stream, subject string, dst []*nats.Msg, from uint64, n int, notAfter time.Time) ([]*nats.Msg, error) {
	done, err := a.lookups.pace(notAfter)(ctx)
	if err != nil {
		return dst, err
	}
	defer done()
	rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	return reader.ReadSubject(rctx, stream, subject, dst, from, n, 1<<20)
}

// decodeCandidate reads a level message's item; false for one that is not
// a delayd message (no due, no index key).
func (a *worker) decodeCandidate(m *nats.Msg, seq uint64, stream, levelName string, q listQuery) (*candidate, bool) {
	due, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderDueAt))
	key := message.LevelKey(m.Header)
	if err != nil || key == "" {
		return nil, false
	}
	ref := cmp.Or(m.Header.Get(message.HdrOrigin), m.Header.Get(message.HdrIngress))
	id := a.listedID(m.Header.Get(message.HdrMsgID))
	if id == "" {
		_, first, _ := message.ParseIngressRef(ref)
		id = "seq:" + strconv.FormatUint(first, 10)
	}
	it := contract.PendingItem{
		ID: id, Due: due.UTC(), Target: q.target, Level: levelName, Stream: stream, Seq: seq,
		Size: len(m.Data), MergeKey: m.Header.Get(message.HdrMerge),
	}
	if t, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderEnqueuedAt)); err == nil {
		it.Enqueued = t.UTC()
	}
	it.Hops, _ = strconv.Atoi(m.Header.Get(message.HdrHops))
	hdr := nats.Header{}
	for k, v := range m.Header {
		hdr[k] = v
	}
	message.StripInternal(hdr)
	delete(hdr, contract.HeaderEnqueuedAt)
	delete(hdr, contract.HeaderDueAt)
	if len(hdr) > 0 {
		it.Headers = hdr
	}
	if q.payload {
		it.Data = m.Data
	}
	return &candidate{item: it, key: key, ref: ref, hop: m.Header.Get(message.HdrHopDue) != ""}, true
}

// listedID is the id a list gives for a publisher's id: "id:" and the id
// when cancel would also read it as something else ([API.idKeys]: a
// decimal, "seq:"/"id:" and the rest, or a delivered id), so that a cancel
// of the listed id names this message only and is never refused as
// ambiguous; the id as is otherwise ("" stays "").
func (a *worker) listedID(id string) string {
	if id == "" {
		return ""
	}
	_, err := strconv.ParseUint(id, 10, 64)
	_, _, delivered := a.cfg.HopKey.DeliveredSeq(id)
	if err == nil || delivered || strings.HasPrefix(id, "seq:") || strings.HasPrefix(id, "id:") {
		return "id:" + id
	}
	return id
}

// page builds the reply from a walk's candidates: in (due, key) order,
// sifted once more by their owners (a message delivered or cancelled
// during the walk is not listed), one per index key (a message seen in
// two levels as it cascaded: the later placement), cut to fit the
// connection's max payload, and the cursor of the next page when more may
// follow.
func (a *worker) page(ctx context.Context, k *walker) (contract.PendingReply, []*candidate, error) {
	cands := make([]*candidate, len(k.h))
	copy(cands, k.h)
	slices.SortFunc(cands, func(x, y *candidate) int {
		if x.less(y) {
			return -1
		}
		return 1
	})
	byStream := make(map[string][]uint64)
	for _, c := range cands {
		byStream[c.item.Stream] = append(byStream[c.item.Stream], c.item.Seq)
	}
	sifted := make(map[string]level.Sifted, len(byStream))
	for stream, seqs := range byStream {
		f, err := a.cfg.Decider.Sift(ctx, stream, seqs)
		if err != nil {
			return contract.PendingReply{}, nil, err
		}
		sifted[stream] = f
	}
	latest := make(map[string]int) // key -> highest hops among the candidates
	for _, c := range cands {
		latest[c.key] = max(latest[c.key], c.item.Hops)
	}
	reply := contract.PendingReply{Target: k.q.target, Items: []contract.PendingItem{}}
	// The reply's JSON, its next included, is at most the max payload
	// less listReplySlack (kept for its headers).
	frame, _ := json.Marshal(reply) // cannot fail
	room := int(a.cfg.Conn.MaxPayload()) - listReplySlack - len(frame)
	var (
		kept  []*candidate
		sizes []int // each kept item's JSON and its comma
	)
	for _, c := range cands {
		if !sifted[c.item.Stream].Pending(c.item.Seq) || c.item.Hops < latest[c.key] {
			continue // delivered, cancelled or forwarded since it was read
		}
		b, _ := json.Marshal(c.item) // cannot fail
		if len(b) > room && len(kept) == 0 && c.item.Data != nil {
			// A payload too large for any reply: the item without it
			// (its size says how large).
			c.item.Data = nil
			b, _ = json.Marshal(c.item)
		}
		kept = append(kept, c)
		sizes = append(sizes, len(b)+1)
	}
	// The items in order while they fit (the first always), then fewer
	// while the next cursor does not fit with them.
	n, used := 0, 0
	for n < len(kept) && (n == 0 || used+sizes[n] <= room) {
		used += sizes[n]
		n++
	}
	for {
		for _, rest := range kept[n:] {
			k.notReturned(rest)
		}
		var last *candidate
		if n > 0 {
			last = kept[n-1]
		}
		reply.Next = k.next(last)
		if reply.Next == "" || n <= 1 || used+len(`,"next":""`)+len(reply.Next) <= room {
			break
		}
		n--
		used -= sizes[n]
	}
	for _, c := range kept[:n] {
		reply.Items = append(reply.Items, c.item)
	}
	return reply, kept[:n], nil
}

// next returns the cursor of the page after one ending at last (nil: a
// page without items), "" when no more may follow.
func (k *walker) next(last *candidate) string {
	more := false
	next := listCursor{D: k.q.cur.D, K: k.q.cur.K, S: make(map[string]uint64)}
	for name, seq := range k.q.cur.S {
		next.S[name] = seq
	}
	for name, w := range k.walks {
		if w.last == 0 {
			continue // nothing of the target read
		}
		next.S[name] = w.last + 1
		if w.resume != 0 {
			next.S[name] = min(w.resume, w.last+1)
		}
		more = more || w.stopped || w.resume != 0
	}
	if last != nil {
		next.D, next.K = last.item.Due.UnixNano(), last.key
	}
	if !more {
		return ""
	}
	return next.encode()
}
