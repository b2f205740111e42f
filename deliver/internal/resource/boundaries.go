package resource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// Partition changes and per-key order (docs/operations.md#partitions-for-hot-levels).
//
// A level's partition count P decides which of its streams a key's
// messages go to. When P changes (1 -> P, P -> 1, P -> Q), a key's older
// messages may wait in another stream of the level than its newer ones:
// a retired stream (drained like a level no longer in the table), or a
// partition that is still in use but was written under the old count.
// Every older message was ingested before every newer one and has the
// same delay, so it is due first; but the stream holding it is delivered
// by its own scanner, perhaps on another replica, which may lag.
//
// So, at the change, setup records in DELAYD_OFFSETS (key
// "partitions.<level stream>") the new count and each stream of the
// level's boundary: its last sequence then. A message at or before its
// stream's boundary was routed under an older count ("old"), one after it
// under the current count ("new"). A scanner does not hand off a new
// message while another stream of its level still holds an old one (its
// committed offset is below its boundary, and the message is still in
// the stream). Old messages are never held, so the old ones drain and the
// new ones follow: no wait in a cycle. Since the old messages are due
// first, the rule delays nothing but a lagging drain. Once a stream's
// offset passes its boundary it is never looked at again: the cost is a
// few reads per stream and scanner, at the change only.
//
// Only every live replica's count being the same (DELAYD_PARTITIONS is a
// shared setting) makes "routed under the current count" one thing.

// partitionsKey is the key, in the offsets bucket, of a level's partition
// record; stream is the level's unpartitioned stream name.
func partitionsKey(stream string) string { return "partitions." + stream }

// partitionRecord is the value of a level's partition record: the count
// the level's streams are routed under, and, from the last change of the
// count, each stream's boundary (its last sequence at the change; streams
// that held nothing are left out).
type partitionRecord struct {
	Partitions int               `json:"partitions"`
	Boundaries map[string]uint64 `json:"boundaries,omitempty"`
}

// partitionBoundaries returns, for each level of want whose streams' last
// change of partition count may still hold old messages, the boundary of
// each of its streams (see above); nil for a level never changed. existing
// lists the level streams that exist, by delay. At a change it records the
// new count and the boundaries (a compare-and-set: a replica starting at
// the same time with the same count takes the record the first one
// wrote).
func partitionBoundaries(ctx context.Context, js jetstream.JetStream, cfg Config, want []levels.Level, existing map[time.Duration][]string) (map[time.Duration]map[string]uint64, error) {
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		return nil, fmt.Errorf("partitions: %w", err)
	}
	kv = hedge.KV(kv)
	out := make(map[time.Duration]map[string]uint64)
	for _, l := range want {
		key := partitionsKey(l.Stream())
		count := cfg.Partitions.Count(l.Delay)
		for attempt := 0; ; attempt++ {
			stored, rev, found := partitionRecord{Partitions: 1}, uint64(0), false // no record: never partitioned
			e, err := kv.Get(ctx, key)
			switch {
			case err == nil:
				found = true
				if jerr := json.Unmarshal(e.Value(), &stored); jerr != nil || stored.Partitions < 1 {
					return nil, fmt.Errorf("partitions: %s holds %q, not a partition record", key, e.Value())
				}
				rev = e.Revision()
			case errors.Is(err, jetstream.ErrKeyNotFound):
			default:
				return nil, fmt.Errorf("partitions: read %s: %w", key, err)
			}
			if stored.Partitions == count {
				if len(stored.Boundaries) > 0 {
					out[l.Delay] = stored.Boundaries
				}
				break
			}
			// A change: every stream of the level holds old messages up
			// to its last sequence now.
			rec := partitionRecord{Partitions: count, Boundaries: map[string]uint64{}}
			for _, name := range existing[l.Delay] {
				str, err := js.Stream(ctx, name)
				if errors.Is(err, jetstream.ErrStreamNotFound) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("partitions: stream %s: %w", name, err)
				}
				if st := str.CachedInfo().State; st.Msgs > 0 {
					rec.Boundaries[name] = st.LastSeq
				}
			}
			v, _ := json.Marshal(rec) // strings and numbers only: always marshals
			if !found {
				_, err = kv.Create(ctx, key, v)
			} else {
				_, err = kv.Update(ctx, key, v, rev)
			}
			if err != nil {
				if attempt < 3 && (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)) {
					continue // another replica recorded it first: take its record
				}
				return nil, fmt.Errorf("partitions: record %s: %w", key, err)
			}
			// Logged at info only when old messages wait: a first start (no
			// record, or nothing stored yet) changes nothing anyone sees.
			logLevel := slog.LevelDebug
			if len(rec.Boundaries) > 0 {
				logLevel = slog.LevelInfo
			}
			cfg.Logger.Log(ctx, logLevel, "level's partition count changed: new messages wait for the old ones of its other streams",
				slog.String("delay", levels.FormatDuration(l.Delay)), slog.Int("from", stored.Partitions), slog.Int("to", count),
				slog.Any("boundaries", rec.Boundaries))
			if len(rec.Boundaries) > 0 {
				out[l.Delay] = rec.Boundaries
			}
			break
		}
	}
	return out, nil
}
