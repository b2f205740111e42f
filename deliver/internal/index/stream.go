package index

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/hedge"
)

// EnsureStreams creates or updates [Stream] and [CancelStream] with
// replicas replicas: file storage, limits retention, direct gets allowed,
// a 100 ms duplicate window. The error names the stream that failed.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, replicas int) error {
	for _, cfg := range []jetstream.StreamConfig{{
		Name:        Stream,
		Description: "delayd id index: where each pending message is, for cancel and merge",
		Subjects:    []string{subjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		Duplicates:  100 * time.Millisecond,
	}, {
		Name:        CancelStream,
		Description: "delayd cancel tombstones: cancelled messages not yet passed by their level",
		Subjects:    []string{tombstoneSubjectPrefix + ">"},
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

// Lookup returns the latest record for key: the one in the newest message
// of key's slot, and the last of its records in that message; rec.At is
// that message's sequence in [Stream]. ok is false when the slot holds no
// record for key. It reads with reader ([Batch] messages at a time, each
// read within perRead), so reader is the caller's goroutine's for the
// call. A message that does not decode yields its records before the
// malformed one ([DecodeRecords]); the rest of the slot still answers.
// The error is the read's, wrapped as "index lookup: ...".
func Lookup(ctx context.Context, reader *jswire.BatchReader, key string, perRead time.Duration) (rec Record, ok bool, err error) {
	return LookupPaced(ctx, reader, key, perRead, nil)
}

// LookupPaced is [Lookup] with each read of the slot paced by pace (see
// [jswire.BatchReader.EachOnSubjectPaced]); pace's error is returned
// wrapped like the reads'.
func LookupPaced(ctx context.Context, reader *jswire.BatchReader, key string, perRead time.Duration, pace func(context.Context) (func(), error)) (rec Record, ok bool, err error) {
	rec, ok, _, err = lookup(ctx, reader, key, perRead, pace)
	return rec, ok, err
}

// LookupLatest is [LookupPaced] reading at least every record the
// stream's leader had stored on key's slot when it was called: it reads
// the slot's last sequence from the leader first ([jswire.LastOnSubject]),
// then walks the slot, and walks it again (after a pause of 10 ms, doubling
// up to 200 ms) while the walk ended below that sequence, as it does when a
// replica behind the leader answered the direct gets (or until the leader
// holds nothing on the slot: a trim purged it). So a record whose write was
// acknowledged before the call is seen. nc is for the leader's reads.
// Errors are the reads' and ctx's, wrapped as "index lookup: ...".
func LookupLatest(ctx context.Context, nc *nats.Conn, reader *jswire.BatchReader, key string, perRead time.Duration, pace func(context.Context) (func(), error)) (rec Record, ok bool, err error) {
	last, found, err := lastOnSlot(ctx, nc, key, perRead)
	pause := 10 * time.Millisecond
	for {
		if err != nil {
			return Record{}, false, err
		}
		rec, ok, seen, err := lookup(ctx, reader, key, perRead, pace)
		if err != nil || !found || seen >= last {
			return rec, ok, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return Record{}, false, fmt.Errorf("index lookup: %w", ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
		_, found, err = lastOnSlot(ctx, nc, key, perRead) // still the walk's bound: last
	}
}

// lastOnSlot reads the sequence of the last message on key's slot from
// [Stream]'s leader; found is false if the slot holds none.
func lastOnSlot(ctx context.Context, nc *nats.Conn, key string, perRead time.Duration) (last uint64, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, perRead)
	defer cancel()
	_, last, found, err = jswire.LastOnSubject(ctx, nc, Stream, Subject(key))
	if err != nil {
		return 0, false, fmt.Errorf("index lookup: %w", err)
	}
	return last, found, nil
}

// lookup is [LookupPaced], also returning the highest sequence of the
// slot's messages it read (0 if none).
func lookup(ctx context.Context, reader *jswire.BatchReader, key string, perRead time.Duration, pace func(context.Context) (func(), error)) (rec Record, ok bool, seen uint64, err error) {
	err = reader.EachOnSubjectPaced(ctx, Stream, Subject(key), Batch, perRead, pace, func(m *nats.Msg, at uint64) {
		seen = max(seen, at)
		DecodeRecords(m.Data, func(r Record) {
			if r.Key == key && at >= rec.At {
				r.At = at // later records in one message are later placements
				rec, ok = r, true
			}
		})
	})
	if err != nil {
		return Record{}, false, 0, fmt.Errorf("index lookup: %w", err)
	}
	return rec, ok, seen, nil
}

// ServerNow is the server's clock, from [Stream]'s info (its reply's
// timestamp); zero if the server does not answer before ctx is done.
func ServerNow(ctx context.Context, js jetstream.JetStream) time.Time {
	stream, err := js.Stream(ctx, Stream)
	if err != nil {
		return time.Time{}
	}
	return stream.CachedInfo().TimeStamp
}

// Trim purges the records of [Stream] stored more than keep before cutoff,
// a server time; a zero cutoff is the server's time now (from the stream
// info's reply; nothing is purged if it has none). It purges by sequence:
// every record below the first one stored at or after cutoff - keep, or
// every record if none is that new. If before is not nil, it is called
// first with the sequences to purge, [first, end), and returns the
// sequence up to which they may go (end, or less to purge a part now and
// the rest at the next trim): the caller keeps what it needs of them
// (the answers). Errors are the server requests' (stream info, the time
// lookup by direct get, the purge) and before's.
func Trim(ctx context.Context, js jetstream.JetStream, cutoff time.Time, keep time.Duration, before func(ctx context.Context, first, end uint64) (uint64, error)) error {
	stream, err := js.Stream(ctx, Stream)
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
	// An index that never held a record has FirstSeq 0; sequences start at 1.
	if from := max(stream.CachedInfo().State.FirstSeq, 1); before != nil && first > from {
		if first, err = before(ctx, from, first); err != nil {
			return err
		}
	}
	if first <= 1 {
		return nil
	}
	return stream.Purge(ctx, jetstream.WithPurgeSequence(first))
}

// SeqAt returns the sequence of the index's first message stored at or
// after t, a server time, or the stream's last sequence + 1 if none is
// that new: the messages below it were stored before t.
func SeqAt(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	seq, err := firstAtOrAfter(ctx, js, t)
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return seq, err
	}
	stream, err := js.Stream(ctx, Stream)
	if err != nil {
		return 0, err
	}
	return stream.CachedInfo().State.LastSeq + 1, nil
}

// firstAtOrAfter returns the sequence of the index's first record stored at
// or after t; [jetstream.ErrMsgNotFound] if there is none.
func firstAtOrAfter(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	req := fmt.Sprintf(`{"start_time":%q}`, t.UTC().Format(time.RFC3339Nano))
	resp, err := hedge.Do(ctx, hedge.After, func(ctx context.Context) (*nats.Msg, error) { // any replica may answer
		return js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET."+Stream, []byte(req))
	})
	if err != nil {
		return 0, err
	}
	if seq := resp.Header.Get(jswire.HeaderSequence); seq != "" {
		return strconv.ParseUint(seq, 10, 64)
	}
	if resp.Header.Get("Status") == "404" {
		return 0, jetstream.ErrMsgNotFound
	}
	return 0, fmt.Errorf("index time lookup: status %q %s", resp.Header.Get("Status"), resp.Header.Get("Description"))
}
