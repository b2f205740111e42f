package deliver

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
)

// The id index: where each pending message is, by id and by merge key.
//
// Cancel and merge need "where is the message with this id (or merge key)
// now" without per-message memory in delayd or in the server. The router
// keeps one small record per level-stream placement in DELAYD_INDEX, on one
// of [IndexSlots] subjects chosen by a hash of the key, so the server
// tracks a bounded set of subjects whatever the backlog (a subject per id
// would cost about 200 bytes of server memory per pending message). The
// router packs the records of up to indexGroupMax placements into one
// message per slot (an index write per message cost a third of the ingest
// rate). A lookup reads only its slot's messages; the latest record for a
// key is the message's current placement (a cascading message gets a new
// record at every hop). Records are stored before the ingress message is
// acked, so once the router has passed an ingress sequence, its record is
// readable.
// The service purges records older than the oldest head any level had
// [IndexKeep] ago, so the index holds about the longest level's wait of
// records, on disk, and a message's records outlive its leaving its level
// by at least IndexKeep.
const (
	// IndexStream holds the id index.
	IndexStream = "DELAYD_INDEX"
	// IndexSlots is how many subjects the index spreads its records over.
	IndexSlots = 256
	// IndexKeep is how long, at least, records of messages that left their
	// level stay (Config.IndexKeep): a cancel that late still answers
	// "already delivered" or "cancelled".
	IndexKeep = time.Minute

	// CancelStream holds cancel tombstones: one message per cancelled,
	// still pending level message, on "delayd.cancels.<level stream>",
	// deleted once the level's offset has passed it.
	CancelStream = "DELAYD_CANCELS"

	indexSubjects  = "delayd.idx."
	cancelSubjects = "delayd.cancels."
	indexBatch     = 256
	indexGroupMax  = 1024 // placements whose records are packed together at most

	// mergeCacheMax bounds the router's cache of the latest placement of
	// each merge key it placed (about 100 bytes an entry).
	mergeCacheMax = 1 << 16
)

// indexRecord is one placement of a message in a level stream.
type indexRecord struct {
	key    string    // "i<id>" or "m<target>\x00<merge key>"
	stream string    // level stream; "" means the message left delayd (dead-lettered or cancelled)
	seq    uint64    // sequence in stream
	hop    bool      // the placement ends in a hop, not a delivery
	gone   bool      // cancelled: later cancels answer "cancelled"
	due    time.Time // the message's final due time
	at     uint64    // the record's own sequence in IndexStream (read side)
	// target is the message's target subject, which a scoped cancel
	// (delayd.api.cancel.<target>) must match; "" in records written before
	// records carried it, and in "left delayd" records that do not know it.
	target string
}

// userKey is the index key of a publisher's Nats-Msg-Id, and seqKey the
// key of a message without one: its first ingress sequence. They differ, so
// a publisher's id "7" never names the message at ingress sequence 7.
func userKey(id string) string { return "u" + id }

func seqKey(seq uint64) string { return "s" + strconv.FormatUint(seq, 10) }

// levelKey is the index key of a level message: its publisher's id, else
// its first ingress sequence (Delayd-Origin of a cascading message, else
// Delayd-Ingress). "" if it has neither.
func levelKey(h nats.Header) string {
	if id := h.Get(hdrMsgID); id != "" {
		return userKey(id)
	}
	ref := h.Get(hdrOrigin)
	if ref == "" {
		ref = h.Get(hdrIngress)
	}
	if _, seq, ok := parseIngressRef(ref); ok {
		return seqKey(seq)
	}
	return ""
}

// mergeKey is the index key of a merge key for a target.
func mergeKey(target, key string) string { return "m" + target + "\x00" + key }

// indexSubject is the slot subject of key.
func indexSubject(key string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return indexSubjects + strconv.FormatUint(h.Sum64()%IndexSlots, 10)
}

// appendTo appends the record's encoding to b:
// "<stream> <seq> <h|c|-> <due unix ns> <key length>[ <target>]\n<key>".
// The target field is optional, so records written before it existed still
// decode (a target is a valid subject: no spaces or newlines).
func (r indexRecord) appendTo(b []byte) []byte {
	b = append(b, r.stream...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.seq, 10)
	switch {
	case r.hop:
		b = append(b, " h "...)
	case r.gone:
		b = append(b, " c "...)
	default:
		b = append(b, " - "...)
	}
	b = strconv.AppendInt(b, r.due.UnixNano(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(r.key)), 10)
	if r.target != "" {
		b = append(b, ' ')
		b = append(b, r.target...)
	}
	b = append(b, '\n')
	return append(b, r.key...)
}

// decodeIndexRecords calls fn for each record packed in data, in order. It
// stops at the first malformed one.
func decodeIndexRecords(data []byte, fn func(indexRecord)) {
	for len(data) > 0 {
		nl := strings.IndexByte(string(data), '\n')
		if nl < 0 {
			return
		}
		f := strings.Split(string(data[:nl]), " ")
		if len(f) != 5 && (len(f) != 6 || f[5] == "") {
			return
		}
		seq, err1 := strconv.ParseUint(f[1], 10, 64)
		due, err2 := strconv.ParseInt(f[3], 10, 64)
		n, err3 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil || err3 != nil || n < 0 || n > len(data)-nl-1 {
			return
		}
		key := string(data[nl+1 : nl+1+n])
		data = data[nl+1+n:]
		rec := indexRecord{key: key, stream: f[0], seq: seq, hop: f[2] == "h", gone: f[2] == "c", due: time.Unix(0, due)}
		if len(f) == 6 {
			rec.target = f[5]
		}
		fn(rec)
	}
}

// msg is an index-stream message holding just this record.
func (r indexRecord) msg() *nats.Msg {
	return &nats.Msg{Subject: indexSubject(r.key), Data: r.appendTo(nil)}
}

// indexGroup packs the records of consecutive placements, one message per
// slot, and tells the acker when they are stored.
type indexGroup struct {
	slots   map[string][]byte // slot subject -> packed records
	n       int               // placements in the group
	futs    []jetstream.PubAckFuture
	err     error
	flushed chan struct{} // closed once the writes are started
	wait    sync.Once
}

func newIndexGroup() *indexGroup {
	return &indexGroup{slots: make(map[string][]byte), flushed: make(chan struct{})}
}

func (g *indexGroup) add(rec indexRecord) {
	subj := indexSubject(rec.key)
	g.slots[subj] = rec.appendTo(g.slots[subj])
}

// flush starts the group's writes.
func (g *indexGroup) flush(js jetstream.JetStream) {
	for subj, data := range g.slots {
		fut, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: data})
		if err != nil {
			g.err = err
			continue
		}
		g.futs = append(g.futs, fut)
	}
	g.slots = nil
	close(g.flushed)
}

// stored waits for the group's writes; it returns the first failure.
func (g *indexGroup) stored() error {
	<-g.flushed
	g.wait.Do(func() {
		for _, fut := range g.futs {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				if g.err == nil {
					g.err = err
				}
			}
		}
		g.futs = nil
	})
	return g.err
}

// lookupPage is how many index messages a lookup reads a time (reader
// must be made for it).
const lookupPage = indexBatch

// lookupIndex returns the latest record for key. ok is false when there is
// none.
func lookupIndex(ctx context.Context, reader *jswire.BatchReader, key string) (rec indexRecord, ok bool, err error) {
	err = reader.EachOnSubject(ctx, IndexStream, indexSubject(key), lookupPage, opTimeout, func(m *nats.Msg, at uint64) {
		decodeIndexRecords(m.Data, func(r indexRecord) {
			if r.key == key && at >= rec.at {
				r.at = at // later records in one message are later placements
				rec, ok = r, true
			}
		})
	})
	if err != nil {
		return indexRecord{}, false, fmt.Errorf("index lookup: %w", err)
	}
	return rec, ok, nil
}

// ensureIndexStreams creates the index and tombstone streams.
func ensureIndexStreams(ctx context.Context, js jetstream.JetStream, replicas int) error {
	for _, cfg := range []jetstream.StreamConfig{{
		Name:        IndexStream,
		Description: "delayd id index: where each pending message is, for cancel and merge",
		Subjects:    []string{indexSubjects + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		Duplicates:  100 * time.Millisecond,
	}, {
		Name:        CancelStream,
		Description: "delayd cancel tombstones: cancelled messages not yet passed by their level",
		Subjects:    []string{cancelSubjects + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		Duplicates:  100 * time.Millisecond,
	}} {
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// serverNow is the server's clock, from the index stream's info; zero if
// the server does not answer.
func serverNow(ctx context.Context, js jetstream.JetStream) time.Time {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	stream, err := js.Stream(ctx, IndexStream)
	if err != nil {
		return time.Time{}
	}
	return stream.CachedInfo().TimeStamp
}

// trimIndex purges index records stored more than keep before cutoff, a
// server time; a zero cutoff is the server's time now.
func trimIndex(ctx context.Context, js jetstream.JetStream, cutoff time.Time, keep time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	stream, err := js.Stream(ctx, IndexStream)
	if err != nil {
		return err
	}
	if cutoff.IsZero() {
		cutoff = stream.CachedInfo().TimeStamp // the server's clock, not delayd's
		if cutoff.IsZero() {
			return nil
		}
	}
	cutoff = cutoff.Add(-keep)
	// The first record at or after cutoff: everything below it goes.
	first, err := firstAtOrAfter(ctx, js, cutoff)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Nothing that new: every record is older than cutoff.
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		first = info.State.LastSeq + 1
	} else if err != nil {
		return err
	}
	if first <= 1 {
		return nil
	}
	return stream.Purge(ctx, jetstream.WithPurgeSequence(first))
}

// firstAtOrAfter returns the sequence of the index's first record stored at
// or after t.
func firstAtOrAfter(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	req := fmt.Sprintf(`{"start_time":%q}`, t.UTC().Format(time.RFC3339Nano))
	resp, err := js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET."+IndexStream, []byte(req))
	if err != nil {
		return 0, err
	}
	if seq := resp.Header.Get(hdrJSSequence); seq != "" {
		return strconv.ParseUint(seq, 10, 64)
	}
	if resp.Header.Get("Status") == "404" {
		return 0, jetstream.ErrMsgNotFound
	}
	return 0, fmt.Errorf("index time lookup: status %q %s", resp.Header.Get("Status"), resp.Header.Get("Description"))
}
