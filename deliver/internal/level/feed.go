package level

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
)

// feedInactiveThreshold is how long the server keeps a scanner's consumer
// without pull requests. A scanner waiting hours for its head lets it go and
// creates a new one when it needs the next message; nothing is lost, since
// the scanner's position is its own.
const feedInactiveThreshold = 10 * time.Minute

// feed reads a level stream in sequence order through an ephemeral,
// unacknowledged pull consumer that the scanner owns and recreates at will.
//
// A consumer, not direct get, because the server delivers consumer messages
// as stored, with their metadata in the reply subject, while a batched
// direct get rewrites every message's headers (six per message) on the
// server: in the burst benchmark that rewriting was a fifth of all CPU.
// The position is the scanner's (its offset), never the consumer's: a
// consumer lost to a server restart or inactivity is recreated at the
// scanner's next sequence.
type feed struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	name    string
	batch   int
	bytes   int
	pull    *jswire.Pull
	started bool
}

func newFeed(nc *nats.Conn, js jetstream.JetStream, stream string, batch, bytes int) *feed {
	return &feed{nc: nc, js: js, stream: stream, name: "delayd-scan-" + stream, batch: batch, bytes: bytes}
}

// reset (re)creates the consumer to start at sequence from and drops
// anything buffered from the previous one.
func (f *feed) reset(ctx context.Context, from uint64) error {
	f.close()
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	if err := f.js.DeleteConsumer(ctx, f.stream, f.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("reset level consumer: %w", err)
	}
	_, err := f.js.CreateConsumer(ctx, f.stream, jetstream.ConsumerConfig{
		Name:              f.name,
		Description:       "delayd scanner: reads the level stream in order; the position is the offset in DELAYD_OFFSETS",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       max(from, 1),
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: feedInactiveThreshold,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return fmt.Errorf("create level consumer: %w", err)
	}
	// A pull's byte limit must leave room for the largest message the
	// server accepts, or that message could never be pulled.
	pull, err := jswire.NewPull(f.nc, f.stream, f.name, f.batch, max(f.bytes, 2*int(f.nc.MaxPayload())))
	if err != nil {
		return err
	}
	f.pull, f.started = pull, true
	return nil
}

// next returns the next message and its stream sequence and store time. A
// receive on wake returns [jswire.ErrWoken]. With
// block unset it returns a nil message at once when none is buffered; with a
// positive timeout it returns a nil message once that long has passed.
func (f *feed) next(ctx context.Context, wake <-chan struct{}, block bool, timeout time.Duration) (*nats.Msg, jswire.AckMeta, error) {
	for {
		m, err := f.pull.Next(ctx, wake, block, timeout)
		if err != nil || m == nil {
			return nil, jswire.AckMeta{}, err
		}
		meta, ok := jswire.ParseAck(m.Reply)
		if !ok {
			continue
		}
		return m, meta, nil
	}
}

func (f *feed) close() {
	if f.pull != nil {
		f.pull.Stop()
		f.pull = nil
	}
}
