package level

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/internal/hedge"
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
	leader  string // the server the consumer was created on (its Cluster.Leader); "" unknown
	suspect string // the server whose consumer went silent (jswire.ErrNoHeartbeat) until a reset placed it elsewhere

	requests atomic.Uint64       // reset's requests sent, every copy counted (lose)
	lose     func(n uint64) bool // tests: the answer to request n is lost (it waits for its context)
}

// feedPlaceTries bounds the consumer creates of one reset that land on
// the suspected server (or go unanswered) before it takes the last one.
const feedPlaceTries = 3

// feedCreateTry bounds one create of a reset: a create placed on a server
// that hangs is answered by nobody, and its copies sent again neither
// (the consumer's server answers a create), so the reset deletes it and
// creates again, placed anew.
const feedCreateTry = 3 * hedge.AfterLeader

func newFeed(nc *nats.Conn, js jetstream.JetStream, stream string, batch, bytes int) *feed {
	return &feed{nc: nc, js: js, stream: stream, name: "delayd-scan-" + stream, batch: batch, bytes: bytes}
}

// reset (re)creates the consumer to start at sequence from and drops
// anything buffered from the previous one.
//
// Each request is sent again while unanswered (hedge.AfterLeader): the
// meta leader, or the consumer's server, that hangs never answers, and the
// copy sent again reaches the new one. A delete answered "not found" is
// done (the first copy, or an earlier reset, deleted it); a create sent
// again with the same config is the same create. The consumer is one
// replica, placed by the server among the stream's: one created on the
// server whose consumer went silent, or whose create is not answered
// within feedCreateTry, is deleted and created again, up to
// feedPlaceTries creates.
func (f *feed) reset(ctx context.Context, from uint64) error {
	f.close()
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	for try := 1; ; try++ {
		if _, err := hedged(ctx, f, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, f.js.DeleteConsumer(ctx, f.stream, f.name)
		}); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("reset level consumer: %w", err)
		}
		cctx, ccancel := context.WithTimeout(ctx, feedCreateTry)
		c, err := hedged(cctx, f, func(ctx context.Context) (jetstream.Consumer, error) {
			return f.js.CreateConsumer(ctx, f.stream, f.config(from))
		})
		ccancel()
		switch {
		case err == nil:
			f.leader = consumerLeader(c.CachedInfo(), f.nc)
			if f.suspect != "" && f.leader == f.suspect && try < feedPlaceTries {
				continue // on the server that went silent: place it again
			}
		case hedge.IsTimeout(err) && ctx.Err() == nil && try < feedPlaceTries:
			continue // unanswered: perhaps placed on a server that hangs
		default:
			return fmt.Errorf("create level consumer: %w", err)
		}
		break
	}
	f.suspect = ""
	// A pull's byte limit must leave room for the largest message the
	// server accepts, or that message could never be pulled.
	pull, err := jswire.NewPull(f.nc, f.stream, f.name, f.batch, max(f.bytes, 2*int(f.nc.MaxPayload())))
	if err != nil {
		return err
	}
	// A pull the consumer's server leaves unanswered ends in
	// jswire.ErrNoHeartbeat (see next) instead of asking it for ever.
	pull.FailUnanswered()
	f.pull, f.started = pull, true
	return nil
}

// hedged is hedge.Do(ctx, hedge.AfterLeader, request) for one of f's
// requests. A copy whose answer a test loses (f.lose) waits for its
// context, as an unanswered one does.
func hedged[T any](ctx context.Context, f *feed, request func(context.Context) (T, error)) (T, error) {
	return hedge.Do(ctx, hedge.AfterLeader, func(ctx context.Context) (T, error) {
		v, err := request(ctx)
		if n := f.requests.Add(1); f.lose != nil && f.lose(n) {
			<-ctx.Done()
			var zero T
			return zero, ctx.Err()
		}
		return v, err
	})
}

// config is the consumer's config to start at sequence from.
func (f *feed) config(from uint64) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Name:              f.name,
		Description:       "delayd scanner: reads the level stream in order; the position is the offset in DELAYD_OFFSETS",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       max(from, 1),
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: feedInactiveThreshold,
		MemoryStorage:     true,
		Replicas:          1,
	}
}

// consumerLeader is the server a consumer info names as the consumer's
// leader. A server not in a cluster names none: the consumer is on the
// server nc is connected to.
func consumerLeader(info *jetstream.ConsumerInfo, nc *nats.Conn) string {
	if info != nil && info.Cluster != nil && info.Cluster.Leader != "" {
		return info.Cluster.Leader
	}
	return nc.ConnectedServerName()
}

// next returns the next message and its stream sequence and store time. A
// receive on wake returns [jswire.ErrWoken]; a consumer whose server
// answers nothing, [jswire.ErrNoHeartbeat] (the next reset places it
// elsewhere). With
// block unset it returns a nil message at once when none is buffered; with a
// positive timeout it returns a nil message once that long has passed.
func (f *feed) next(ctx context.Context, wake <-chan struct{}, block bool, timeout time.Duration) (*nats.Msg, jswire.AckMeta, error) {
	for {
		m, err := f.pull.Next(ctx, wake, block, timeout)
		if errors.Is(err, jswire.ErrNoHeartbeat) {
			f.suspect = f.leader
		}
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
