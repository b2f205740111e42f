package index

import (
	"strconv"
	"strings"

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
	// this process, else "" (the index record has it).
	Target string
	// At is the tombstone's own sequence in [CancelStream]. Not encoded.
	At uint64
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
