// Package offsets persists each level stream's delivery offset in the
// DELAYD_OFFSETS JetStream key-value bucket.
//
// An offset is the last level-stream sequence whose hand-off to its target was
// confirmed (a PubAck for a stream-bound target, a flush round trip for a core
// subject). After any restart a scanner resumes at offset+1, so only messages
// past the last committed offset are delivered again. This is RocketMQ 4's
// ScheduleMessageService offset table, except that delayd commits after every
// confirmed batch instead of every 10 s. A scanner commits through a
// [Committer], which keeps one write in flight behind the deliveries it
// confirms.
//
// With several replicas, one owns each level stream (through a lease in
// the DELAYD_LEASES bucket), and the offset key's KV revision is its fencing token: a new
// owner [Store.Bump]s the key, and a [Committer] with
// [CommitterConfig.Fenced] writes each offset as a compare-and-set at the
// revision of its previous write, so a paused old owner's next commit fails
// with [ErrFenced] instead of overwriting (or moving back) the new owner's
// offset.
//
// Each key is a level stream's name (for example "DELAYD_5S") and each value is
// the sequence as decimal text, so operators can read and fix it with any KV
// client: nats kv get DELAYD_OFFSETS DELAYD_5S.
package offsets

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
)

// Bucket is the name of the key-value bucket that holds the offsets.
const Bucket = "DELAYD_OFFSETS"

// Config configures a [Store].
type Config struct {
	// Replicas is the bucket's replica count. Optional. Default 1.
	Replicas int

	// Logger receives corrections. Optional. Default discards.
	Logger *slog.Logger
}

// Store reads and commits level offsets. It is safe for concurrent use; each
// level stream's scanner owns its own key.
type Store struct {
	js       jetstream.JetStream // fenced writes, which carry a write id ([Store.updateTagged])
	kv       jetstream.KeyValue
	kvStream jetstream.Stream // the bucket's stream, for delete markers
	logger   *slog.Logger

	// Bump's and CorrectAt's writes are sent in copies, as a fenced
	// Committer's ([Store.writeCopies]), with write ids of their own.
	idPre  string              // "<random>-": write ids are idPre and a count
	writes atomic.Uint64       // writes started: the count in their write ids
	copies atomic.Uint64       // copies sent (lose)
	lose   func(n uint64) bool // tests: drop the answer to copy n (LoseBumpAnswers)

	mu   sync.Mutex
	last map[string]uint64 // last committed (or loaded) offset per stream
}

// New creates or updates the [Bucket] and returns a Store on it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("offsets: replicas %d: must be at least 1", cfg.Replicas)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "delayd: last delivered sequence per level stream (decimal text)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("offsets: create bucket %s: %w", Bucket, err)
	}
	kvStream, err := js.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return nil, fmt.Errorf("offsets: bucket %s: %w", Bucket, err)
	}
	return &Store{js: js, kv: hedge.KV(kv), kvStream: kvStream, logger: logger, idPre: rand.Text()[:16] + "-", last: make(map[string]uint64)}, nil
}

// Load returns the committed offset of a level stream. It returns an error
// wrapping [ErrNotFound] when there is none (and also [ErrDeleted] when the
// key was deleted or purged), and [ErrCorrupt] when the stored value is not
// a decimal sequence.
func (s *Store) Load(ctx context.Context, stream string) (uint64, error) {
	seq, _, err := s.LoadRevision(ctx, stream)
	return seq, err
}

// LoadRevision is [Store.Load] that also returns the key's KV revision: the
// revision a fenced [Committer] ([CommitterConfig.Fenced]) starts from
// ([Committer.ResetAt]). For a deleted or purged key it returns the
// marker's revision with the error; for a key never written, 0. With
// [ErrCorrupt] it returns the corrupt entry's revision.
func (s *Store) LoadRevision(ctx context.Context, stream string) (offset, revision uint64, err error) {
	e, err := s.kv.Get(ctx, stream)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// A deleted key leaves a marker as its last (and, with History 1,
		// only) message; a key never written has none.
		if m, merr := hedge.Do(ctx, hedge.After, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
			return s.kvStream.GetLastMsgForSubject(ctx, "$KV."+Bucket+"."+stream)
		}); merr == nil {
			op := "deleted"
			if r := m.Header.Get(jetstream.MarkerReasonHeader); m.Header.Get("KV-Operation") == "PURGE" || r == "Purge" || r == "MaxAge" {
				op = "purged"
			}
			return 0, m.Sequence, fmt.Errorf("%w for %s: %w (key %s at revision %d, %s)", ErrNotFound, stream, ErrDeleted,
				op, m.Sequence, m.Time.UTC().Format(time.RFC3339))
		}
		return 0, 0, fmt.Errorf("%w for %s", ErrNotFound, stream)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("offsets: load %s: %w", stream, err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, e.Revision(), fmt.Errorf("%w: %s = %q", ErrCorrupt, stream, e.Value())
	}
	s.mu.Lock()
	s.last[stream] = seq
	s.mu.Unlock()
	return seq, e.Revision(), nil
}

// Bump fences the level stream's offset key for a new owner: it reads the
// committed offset and writes the same value back at the revision read,
// and returns the offset and the new revision. A previous owner still
// committing at an older revision then fails with [ErrFenced] (RocketMQ has
// no such step; it is the "fencing token" of a lease-based design, the
// key's revision being the token).
//
// Errors: as [Store.LoadRevision] when there is no decimal offset to bump
// (nothing is written; revision is the marker's or the corrupt entry's, 0
// if never written): the new owner then chooses its start and commits it
// fenced at that revision, which fails with [ErrFenced] if another writer
// got there first. A concurrent write between the read and the bump
// returns [ErrFenced].
//
// The write goes to the bucket's stream leader, and one that hangs never
// answers: it is sent in copies as a fenced [Committer]'s write is
// ([CommitAttemptDefault] each, within [CommitTimeoutDefault] or ctx), and
// a copy refused because an earlier copy was applied counts as the bump
// (docs/design.md#re-sent-writes-to-a-hung-leader).
func (s *Store) Bump(ctx context.Context, stream string) (offset, revision uint64, err error) {
	offset, revision, err = s.LoadRevision(ctx, stream)
	if err != nil {
		return offset, revision, err
	}
	revision, err = s.writeCopies(ctx, s.copyWrite(stream, offset, revision))
	if err != nil {
		return 0, 0, err
	}
	return offset, revision, nil
}

// Commit stores seq as the stream's offset. Committing the offset already
// stored is a no-op without a round trip. Moving it backwards returns
// [ErrRegress].
func (s *Store) Commit(ctx context.Context, stream string, seq uint64) error {
	s.mu.Lock()
	last, ok := s.last[stream]
	s.mu.Unlock()
	if ok && seq == last {
		return nil
	}
	if ok && seq < last {
		return fmt.Errorf("%w: %s from %d to %d", ErrRegress, stream, last, seq)
	}
	_, err := s.put(ctx, stream, seq)
	return err
}

// Correct stores seq as the stream's offset even if it moves backwards, and
// logs the correction with its reason. Scanners use it when the stored
// offset makes no sense for the stream (beyond its last sequence, below its
// first, or corrupt).
func (s *Store) Correct(ctx context.Context, stream string, seq uint64, reason string) error {
	s.logger.Warn("offset corrected", slog.String("stream", stream), slog.Uint64("offset", seq), slog.String("reason", reason))
	_, err := s.put(ctx, stream, seq)
	return err
}

// CorrectAt is [Store.Correct] for a fenced owner: it stores seq, even
// backwards, as a compare-and-set at revision (0: the key must not exist),
// logs the correction with its reason, and returns the revision the write
// got. A revision mismatch returns an error wrapping [ErrFenced]. It is
// sent in copies as [Store.Bump]'s write is.
func (s *Store) CorrectAt(ctx context.Context, stream string, seq, revision uint64, reason string) (uint64, error) {
	s.logger.Warn("offset corrected", slog.String("stream", stream), slog.Uint64("offset", seq), slog.String("reason", reason))
	return s.writeCopies(ctx, s.copyWrite(stream, seq, revision))
}

// copyWrite is the Store's own fenced write of seq at revision rev, with a
// write id of its own.
func (s *Store) copyWrite(stream string, seq, rev uint64) copyWrite {
	return copyWrite{
		stream: stream, seq: seq, rev: rev, id: s.idPre + strconv.FormatUint(s.writes.Add(1), 10),
		attempt: CommitAttemptDefault, bound: CommitTimeoutDefault, logger: s.logger,
		lost: func() bool { n := s.copies.Add(1); return s.lose != nil && s.lose(n) },
	}
}

// writeIDHeader carries the id of a fenced offset write
// ([Store.updateTagged]): unique to the write, so a write sent again can
// tell its own first copy, applied, from another owner's write of the same
// value (docs/design.md#re-sent-writes-to-a-hung-leader).
const writeIDHeader = "Delayd-Offset-Write"

// updateTagged is [Store.update] carrying id (unique to this write, the
// same in every copy of it) in the [writeIDHeader] header, which
// [Store.ownWrite] reads back. The key's value stays the decimal text
// operators read.
func (s *Store) updateTagged(ctx context.Context, stream string, seq, rev uint64, id string) (uint64, error) {
	var buf [20]byte
	m := &nats.Msg{Subject: "$KV." + Bucket + "." + stream, Header: nats.Header{writeIDHeader: {id}}, Data: strconv.AppendUint(buf[:0], seq, 10)}
	ack, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev))
	if wrongLastSeq(err) {
		return 0, fmt.Errorf("%w: commit %s=%d at revision %d: %w: %w", ErrFenced, stream, seq, rev, err, jetstream.ErrKeyRevisionMismatch)
	}
	if err != nil {
		return 0, fmt.Errorf("offsets: commit %s=%d at revision %d: %w", stream, seq, rev, err)
	}
	s.mu.Lock()
	s.last[stream] = seq
	s.mu.Unlock()
	return ack.Sequence, nil
}

// ownWrite reads the key's last entry after a copy of the write id, sent
// at revision rev, failed its compare-and-set, and tells whose write the
// key holds: own (the entry carries id: an earlier copy of this write was
// applied, at the revision returned), or another writer's (own false, at a
// revision past rev). stale reports a read that does not show the write
// that failed the compare-and-set yet (a replica behind: the entry's
// revision is rev or lower); read again then. Direct gets, which any
// replica answers, hedged.
func (s *Store) ownWrite(ctx context.Context, stream string, rev uint64, id string) (own, stale bool, revision uint64, err error) {
	m, err := hedge.Do(ctx, hedge.After, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return s.kvStream.GetLastMsgForSubject(ctx, "$KV."+Bucket+"."+stream)
	})
	if err != nil {
		return false, false, 0, fmt.Errorf("offsets: read back %s: %w", stream, err)
	}
	if m.Sequence <= rev {
		return false, true, m.Sequence, nil
	}
	return m.Header.Get(writeIDHeader) == id, false, m.Sequence, nil
}

// wrongLastSeq reports whether err is the server's refusal of a write
// whose expected last sequence (here: per subject) did not hold (code
// 10071, or 10164 on a replicated stream).
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// noteCommitted records seq as the stream's last committed offset (a
// write recognised as applied after its answer was lost).
func (s *Store) noteCommitted(stream string, seq uint64) {
	s.mu.Lock()
	s.last[stream] = seq
	s.mu.Unlock()
}

// put stores seq as the stream's offset and returns the KV revision the
// write got (the PubAck's sequence).
func (s *Store) put(ctx context.Context, stream string, seq uint64) (uint64, error) {
	var buf [20]byte
	rev, err := s.kv.Put(ctx, stream, strconv.AppendUint(buf[:0], seq, 10))
	if err != nil {
		return 0, fmt.Errorf("offsets: commit %s=%d: %w", stream, seq, err)
	}
	s.mu.Lock()
	s.last[stream] = seq
	s.mu.Unlock()
	return rev, nil
}
