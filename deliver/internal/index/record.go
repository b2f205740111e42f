package index

import (
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

const (
	// Stream is the name of the stream that holds the id index.
	Stream = "DELAYD_INDEX"

	// Slots is how many subjects the index spreads its records over:
	// "delayd.idx.0" to "delayd.idx.255" ([Subject]).
	Slots = 256

	// Batch is how many index messages a [Lookup] reads at a time: the
	// [jswire.BatchReader] it reads with must allow at least this many
	// (maxBatch of [jswire.NewBatchReader]).
	Batch = 256

	// GroupMax is how many placements' records a [Group] should pack at
	// most before it is flushed.
	GroupMax = 1024

	// subjectPrefix starts every slot subject.
	subjectPrefix = contract.InternalPrefix + ".idx."
)

// Record is one index record: one placement of a message in a level
// stream, or the message's leaving delayd. Its wire form ([Record.AppendTo])
// is one line and the key:
//
//	"<stream> <seq> <h|c|-> <due unix ns> <key length>[ <target>]\n<key>"
//
// h marks a placement that ends in a hop, c a cancelled message, - any
// other. The key length is in bytes. The target field is optional, so
// records written before it existed (five fields) still decode.
type Record struct {
	// Key is the message's index key: [UserKey], [SeqKey] or [MergeKey].
	Key string
	// Stream is the level stream; "" means the message left delayd
	// (dead-lettered, delivered from a hop's level, or cancelled).
	Stream string
	// Seq is the message's sequence in Stream.
	Seq uint64
	// Hop is true when the placement ends in a hop to another level, not
	// a delivery.
	Hop bool
	// Gone is true for a cancelled message: later cancels answer
	// "cancelled". The wire form keeps only Hop when both are set.
	Gone bool
	// Due is the message's final due time (Unix nanoseconds on the wire).
	Due time.Time
	// At is the record's own sequence in [Stream], set by [Lookup]; it is
	// not encoded.
	At uint64
	// Target is the message's target subject, which a scoped cancel
	// (delayd.api.cancel.<target>) must match: "" in records written before
	// records carried it, and in "left delayd" records that do not know it.
	// It is a subject, so it holds no space or newline.
	Target string
}

// UserKey is the index key of a publisher's Nats-Msg-Id: "u<id>".
func UserKey(id string) string { return "u" + id }

// SeqKey is the index key of a message without a publisher's id: its first
// ingress sequence, "s<seq>" in decimal. It differs from [UserKey], so a
// publisher's id "7" never names the message at ingress sequence 7.
func SeqKey(seq uint64) string { return "s" + strconv.FormatUint(seq, 10) }

// MergeKey is the index key of a merge key for a target:
// "m<target>\x00<merge key>".
func MergeKey(target, key string) string { return "m" + target + "\x00" + key }

// IsMergeKey reports whether key is a [MergeKey]. key must not be "".
func IsMergeKey(key string) bool { return key[0] == 'm' }

// Subject is the slot subject of key, "delayd.idx.<0..Slots-1>": the
// FNV-1a 64-bit hash of key modulo [Slots].
func Subject(key string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return subjectPrefix + strconv.FormatUint(h.Sum64()%Slots, 10)
}

// AppendTo appends the record's wire form (see [Record]) to b and returns
// the extended slice. At is not encoded.
func (r Record) AppendTo(b []byte) []byte {
	b = append(b, r.Stream...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.Seq, 10)
	switch {
	case r.Hop:
		b = append(b, " h "...)
	case r.Gone:
		b = append(b, " c "...)
	default:
		b = append(b, " - "...)
	}
	b = strconv.AppendInt(b, r.Due.UnixNano(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(r.Key)), 10)
	if r.Target != "" {
		b = append(b, ' ')
		b = append(b, r.Target...)
	}
	b = append(b, '\n')
	return append(b, r.Key...)
}

// Msg is an index message holding just this record, on its key's slot
// subject.
func (r Record) Msg() *nats.Msg {
	return &nats.Msg{Subject: Subject(r.Key), Data: r.AppendTo(nil)}
}

// DecodeRecords calls fn with each record packed in data, in order (later
// records are later placements). It stops silently at the first malformed
// record, so fn has seen the ones before it: a line without its newline,
// other than five or six space-separated fields (or six with an empty
// target), a sequence, due time or key length that is not a decimal
// integer (the sequence unsigned, the key length not negative), or a key
// length beyond the data. A flag other than h or c reads as "-". At is
// left zero.
func DecodeRecords(data []byte, fn func(Record)) {
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
		rec := Record{Key: key, Stream: f[0], Seq: seq, Hop: f[2] == "h", Gone: f[2] == "c", Due: time.Unix(0, due)}
		if len(f) == 6 {
			rec.Target = f[5]
		}
		fn(rec)
	}
}
