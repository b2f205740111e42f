package deliver

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// Kept answers (docs/guide.md#kept-answers): the id index keeps a message's records
// for about [IndexKeep] after it left its level; before the trim purges
// them, the janitor writes each message's final answer to
// [AnswerStream], where it is kept for [Config].AnswerKeep. Cancel and
// status look there when the index no longer knows an id.
const (
	// AnswerStream holds the kept answers: "DELAYD_ANSWERS", one subject
	// per id.
	AnswerStream = index.AnswerStream

	// AnswerKeepDefault is [Config].AnswerKeep's default
	// (DELAYD_ANSWER_KEEP): 6 hours.
	AnswerKeepDefault = contract.AnswerKeepDefault
	// AnswerKeepMin and AnswerKeepMax bound [Config].AnswerKeep.
	AnswerKeepMin = contract.AnswerKeepMin
	AnswerKeepMax = contract.AnswerKeepMax

	// AnswerMaxBytesDefault is [Config].AnswerMaxBytes's default
	// (DELAYD_ANSWER_MAX_BYTES): 256 MiB on disk, about 2.3 million
	// answers (docs/guarantees.md#what-kept-answers-cost).
	AnswerMaxBytesDefault = contract.AnswerMaxBytesDefault
	// AnswerMaxBytesMin is [Config].AnswerMaxBytes's least value: 1 MiB.
	AnswerMaxBytesMin = contract.AnswerMaxBytesMin

	// AnswerKeepOff as [Config].AnswerKeep turns kept answers off
	// (DELAYD_ANSWER_KEEP=0 or off): no DELAYD_ANSWERS writes or reads, one
	// JetStream write and one read fewer per message, and cancel and
	// status answer "not found" about [IndexKeep] after a message left its
	// level (docs/guarantees.md#what-kept-answers-cost).
	AnswerKeepOff time.Duration = -1
)

const (
	// answerPassMax bounds the time one trim pass spends keeping answers;
	// what it did not reach is kept (and purged) at the next pass.
	answerPassMax = 20 * time.Second
	// answerLagMax and answerRangeMax bound how far answers may hold the
	// trim back: index messages stored more than answerLagMax before the
	// trim's cutoff, and all but the newest answerRangeMax index messages
	// to purge, are purged without their answers (counted in
	// [AnswerStats].Skipped). So the id index holds at most about
	// IndexKeep + answerLagMax of records, whatever the answers' pace.
	answerLagMax   = 5 * time.Minute
	answerRangeMax = 1 << 20
	// answerInFlight is how many answer writes are in flight at most
	// (below nats.go's default async limit, 4,000).
	answerInFlight = 1024
	// answerChunk is how many index records are read before their answers
	// are written.
	answerChunk = 64 * 1024
)

// keepAnswers writes the final answer of every message whose last record
// in the index is in [first, end) (sequences of [IndexStream] the trim
// will purge), and returns the sequence up to which it did: the trim
// purges below it. Each key's latest record in the range decides
// ([index.AnswerOf]); a later record beyond it (a gone record written
// after the placement, an id placed again) is itself answered when it is
// trimmed, overwriting this answer, and meanwhile the index answers for
// it. It runs on the janitor's trim goroutine, with reader its own.
func (j *janitor) keepAnswers(ctx context.Context, js jetstream.JetStream, reader *jswire.BatchReader, first, end uint64) (uint64, error) {
	s := j.s
	deadline := time.Now().Add(s.answers.work.bounds.passMax)
	var buf []*nats.Msg
	for first < end && time.Now().Before(deadline) {
		latest := make(map[string]index.Record)
		var order []string // keys in the order of their latest record
		next := first
		for next < end && len(order) < answerChunk {
			rctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
			var err error
			buf, err = reader.Read(rctx, IndexStream, buf[:0], next, index.Batch, 1<<20)
			cancel()
			if err != nil {
				return first, fmt.Errorf("answers: read index: %w", err)
			}
			if len(buf) == 0 {
				next = end
				break
			}
			for _, m := range buf {
				seq, err := strconv.ParseUint(m.Header.Get(jswire.HeaderSequence), 10, 64)
				if err != nil || seq >= end {
					next = end
					break
				}
				next = seq + 1
				index.DecodeRecords(m.Data, func(r index.Record) {
					if _, seen := latest[r.Key]; !seen {
						order = append(order, r.Key)
					}
					latest[r.Key] = r
				})
			}
		}
		// Written in windows of answerInFlight, each window's PubAcks
		// awaited before the next: the stream stores a key's answers in
		// the order of its records.
		var acks []jetstream.PubAckFuture
		wait := func() error {
			for _, ack := range acks {
				select {
				case <-ack.Ok():
				case err := <-ack.Err():
					return fmt.Errorf("answers: write: %w", err)
				case <-ctx.Done():
					return fmt.Errorf("answers: write: %w", ctx.Err())
				}
			}
			s.answers.work.kept.Add(uint64(len(acks)))
			acks = acks[:0]
			return nil
		}
		for _, key := range order {
			a, ok := index.AnswerOf(latest[key])
			if !ok {
				continue
			}
			ack, err := js.PublishMsgAsync(a.Msg())
			if err != nil {
				return first, fmt.Errorf("answers: write: %w", err)
			}
			if acks = append(acks, ack); len(acks) == answerInFlight {
				if err := wait(); err != nil {
					return first, err
				}
			}
		}
		if err := wait(); err != nil {
			return first, err
		}
		first = next
	}
	return first, nil
}

// answerBounds bound the answers' hold on the id index trim: passMax,
// lagMax and rangeMax, by default answerPassMax, answerLagMax and
// answerRangeMax (tests make them small). Set by New, read-only after.
type answerBounds struct {
	passMax  time.Duration
	lagMax   time.Duration
	rangeMax uint64
}

// answerWork is the janitor's kept-answer state: bounds, set by New and
// read-only after, and the counters, written by the trim goroutine and
// read by [Service.AnswerStats].
type answerWork struct {
	bounds        answerBounds
	kept, skipped atomic.Uint64 // answers written; index messages trimmed without their answers
}

// AnswerStats counts the kept answers' work since start.
type AnswerStats struct {
	// Kept counts answers written to DELAYD_ANSWERS.
	Kept uint64
	// Skipped counts id index messages (each holds the records of one or
	// more messages) the trim purged without their answers kept, because
	// the answers fell further behind than their bound
	// (docs/guarantees.md#what-kept-answers-cost).
	Skipped uint64
}

// AnswerStats returns the kept answers' counters.
func (s *Service) AnswerStats() AnswerStats {
	return AnswerStats{Kept: s.answers.work.kept.Load(), Skipped: s.answers.work.skipped.Load()}
}

// answerBeforeTrim is the trim's hook (index.Trim's before) for the index
// messages [from, end) it is about to purge, cutoff being the trim's
// (the store time below which records go, before indexStoreSkew). It
// keeps their answers, but never holds the trim beyond the answers'
// bounds: the messages older than lagMax before the trim's own cutoff,
// and all but the newest rangeMax, may go unanswered; so may the rest
// if writing answers fails, beyond what was written. What went
// unanswered is counted and logged once.
func (j *janitor) answerBeforeTrim(ctx context.Context, js jetstream.JetStream, reader *jswire.BatchReader, cutoff time.Time, from, end uint64) (uint64, error) {
	s := j.s
	floor := from // below it, purged unanswered
	if end-from > s.answers.work.bounds.rangeMax {
		floor = end - s.answers.work.bounds.rangeMax
	}
	sctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	old, err := index.SeqAt(sctx, js, cutoff.Add(-indexStoreSkew-s.answers.work.bounds.lagMax))
	cancel()
	if err != nil {
		return from, fmt.Errorf("answers: %w", err)
	}
	floor = min(max(floor, old), end)
	done, err := j.keepAnswers(ctx, js, reader, floor, end)
	if err != nil && ctx.Err() == nil {
		s.logger.Warn("kept answers failed", slog.Any("error", err))
	}
	if floor > from {
		s.answers.work.skipped.Add(floor - from)
		s.logger.Warn("id index trimmed without kept answers: they fell behind",
			slog.Uint64("index_messages", floor-from), slog.Duration("lag_max", s.answers.work.bounds.lagMax), slog.Uint64("range_max", s.answers.work.bounds.rangeMax))
	}
	return max(done, floor), nil
}
