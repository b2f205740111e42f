package index

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

const (
	// CancelStream is the name of the stream that holds cancel tombstones:
	// one message per cancelled, still pending level message, on
	// [TombstoneSubject] of its level stream, deleted once the level's
	// offset has passed it.
	CancelStream = "DELAYD_CANCELS"

	// tombstoneSubjectPrefix starts every tombstone's subject.
	tombstoneSubjectPrefix = contract.InternalPrefix + ".cancels."
)

// TombstoneSubject is the subject of the tombstones of levelStream's
// messages: "delayd.cancels.<level stream>", e.g.
// "delayd.cancels.DELAYD_5S".
func TombstoneSubject(levelStream string) string { return tombstoneSubjectPrefix + levelStream }

// Tombstone is a cancelled level message's record in [CancelStream]. Its
// wire form ([Tombstone.Encode]) is
//
//	"<level seq>\n<index key>\n<merge index key>"
//
// with the sequence in decimal and the merge index key "" if none. It is a
// value: the state that changes while it waits for its level (whether its
// "cancelled" index records are written, whether a janitor has it) is the
// holder's.
type Tombstone struct {
	// Seq is the cancelled message's sequence in its level stream.
	Seq uint64
	// Key is the message's index key, checked against the message when
	// the level reaches Seq. Never "" in a decoded tombstone.
	Key string
	// MergeKey is its merge key's index key ([MergeKey]), "" if none.
	MergeKey string
	// Target is its target subject. Not encoded: known when cancelled by
	// this process, or read from an intent's [HdrTarget] header, else ""
	// (the index record has it).
	Target string
	// At is the tombstone's own sequence in [CancelStream]. Not encoded.
	At uint64
	// Move, if set, makes the tombstone a move's intent
	// (docs/pending.md#22-the-writes-in-order): the message is not
	// cancelled but written again to ingress, due at Move. Not in the
	// body: it is the [HdrMoveDue] header, so a delayd that does not know
	// moves reads an intent as a cancel.
	Move time.Time
}

// Headers of the messages in [CancelStream] beside the tombstone's body
// (docs/pending.md#23-the-book-and-the-loop).
const (
	// HdrTarget is a move's intent's target subject ([Tombstone].Target).
	HdrTarget = "Delayd-Target"
	// HdrMoveDue makes a tombstone an intent: the move's new due,
	// [contract.TimeLayout] ([Tombstone].Move).
	HdrMoveDue = "Delayd-Move-Due"
	// HdrMoved makes a message a placed mark: the sequence in
	// [CancelStream] of the intent whose new message is stored, decimal
	// ([PlacedMark]).
	HdrMoved = "Delayd-Moved"
)

// Msg returns the tombstone as the message to publish to
// [TombstoneSubject](levelStream): [Tombstone.Encode] as the body, and
// for an intent (Move set) the [HdrMoveDue] header and, if known, the
// [HdrTarget] one. A cancel's tombstone has no headers.
func (t Tombstone) Msg(levelStream string) *nats.Msg {
	m := &nats.Msg{Subject: TombstoneSubject(levelStream), Data: t.Encode()}
	if t.Move.IsZero() {
		return m
	}
	m.Header = nats.Header{HdrMoveDue: {contract.FormatTime(t.Move)}}
	if t.Target != "" {
		m.Header[HdrTarget] = []string{t.Target}
	}
	return m
}

// DecodeTombstoneMsg reads a tombstone message of [CancelStream]: its body
// as [DecodeTombstone] does, and an intent's headers ([HdrMoveDue],
// [HdrTarget]). ok is false for a body DecodeTombstone refuses, a placed
// mark, or an [HdrMoveDue] that is not an RFC 3339 time (not one delayd
// wrote: it cancels nothing).
func DecodeTombstoneMsg(m *nats.Msg, at uint64) (t Tombstone, ok bool) {
	if t, ok = DecodeTombstone(m.Data, at); !ok || m.Header == nil {
		return t, ok
	}
	if m.Header.Get(HdrMoved) != "" {
		return Tombstone{}, false
	}
	t.Target = m.Header.Get(HdrTarget)
	if v := m.Header.Get(HdrMoveDue); v != "" {
		due, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return Tombstone{}, false
		}
		t.Move = due
	}
	return t, true
}

// PlacedMark says a move's new message is stored
// (docs/pending.md#22-the-writes-in-order, step 7): it names its intent
// by the intent's sequence in [CancelStream]. Its wire form is the header
// [HdrMoved] and the body "moved <intent>", which [DecodeTombstone] refuses
// (no newline), so a delayd that does not know moves ignores it.
type PlacedMark struct {
	// Intent is the intent's sequence in [CancelStream] ([Tombstone].At).
	Intent uint64
	// At is the mark's own sequence in [CancelStream]. Not encoded.
	At uint64
}

// Msg returns the mark as the message to publish to
// [TombstoneSubject](levelStream).
func (p PlacedMark) Msg(levelStream string) *nats.Msg {
	seq := strconv.FormatUint(p.Intent, 10)
	return &nats.Msg{Subject: TombstoneSubject(levelStream), Header: nats.Header{HdrMoved: {seq}}, Data: []byte("moved " + seq)}
}

// DecodePlacedMark reads a placed mark; at is its sequence in
// [CancelStream]. ok is false for a message without [HdrMoved] or whose
// value is not a positive decimal sequence.
func DecodePlacedMark(m *nats.Msg, at uint64) (PlacedMark, bool) {
	if m.Header == nil {
		return PlacedMark{}, false
	}
	v := m.Header.Get(HdrMoved)
	seq, err := strconv.ParseUint(v, 10, 64)
	if err != nil || seq == 0 {
		return PlacedMark{}, false
	}
	return PlacedMark{Intent: seq, At: at}, true
}

// Encode returns the tombstone's wire form (see [Tombstone]). Target and
// At are not encoded.
func (t Tombstone) Encode() []byte {
	return []byte(strconv.FormatUint(t.Seq, 10) + "\n" + t.Key + "\n" + t.MergeKey)
}

// DecodeTombstone reads a tombstone's wire form; at is its sequence in
// [CancelStream], kept as At. ok is false when data has no newline, its
// first line is not an unsigned decimal integer, or its key (second line)
// is empty. Everything after the second newline, newlines included, is
// the merge index key; with only one newline it is "".
func DecodeTombstone(data []byte, at uint64) (t Tombstone, ok bool) {
	f := strings.SplitN(string(data), "\n", 3)
	if len(f) < 2 {
		return Tombstone{}, false
	}
	seq, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || f[1] == "" {
		return Tombstone{}, false
	}
	t = Tombstone{Seq: seq, Key: f[1], At: at}
	if len(f) == 3 {
		t.MergeKey = f[2]
	}
	return t, true
}
