package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/offsets"
)

// join opens the lease bucket (without changing it) and starts this
// replica's membership: it fails with an error wrapping lease.ErrMismatch
// if a live replica's level table, prefix or replica count differs. The
// membership lasts until ctx ends.
func (s *Service) join(ctx context.Context, holder string) (*lease.Membership, error) {
	// 10 s: creates of the bucket sent at once by replicas started
	// together may go unanswered (see setupInTurn); the retry finds it.
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bucket, err := lease.BindBucket(jctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas})
	if err != nil {
		return nil, err
	}
	m, err := lease.NewMembership(bucket, lease.MembershipConfig{Holder: holder, TTL: s.cfg.LeaseTTL, Settings: s.sharedSettings(),
		Logger: s.logger.With(slog.String("component", "membership"))})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// permanent returns the error Run stops with for a setup or join error
// that no retry can mend, nil for any other: a replica count the server
// cannot give (not clustered) wraps [ErrReplicasUnsupported] and names
// DELAYD_REPLICAS.
func (s *Service) permanent(err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == jsErrReplicasNotSupported {
		return fmt.Errorf("DELAYD_REPLICAS=\"%d\": %w (%w)", s.cfg.Replicas, ErrReplicasUnsupported, err)
	}
	return nil
}

// jsErrReplicasNotSupported is JetStream's error code for a stream of
// more than one replica on a server that is not clustered
// (nats-server's JSStreamReplicasNotSupportedErr).
const jsErrReplicasNotSupported jetstream.ErrorCode = 10074

// setupInTurn runs setup while holding the lease [ownership.SetupKey], so
// that replicas set up one at a time: identical stream creates sent at
// once by several replicas to a cluster can all go unanswered
// (nats-server v2.15.2: three replicas started together waited 60 to 91 s
// for their streams, integration TestReplicasStartTogether). The lease is
// released once setup returns; one left by a replica that crashed in its
// setup is taken a lease TTL after its last renewal. Each later replica's
// setup finds every stream in place and changes nothing.
func (s *Service) setupInTurn(ctx context.Context, holder string) ([]string, *offsets.Store, *lease.Bucket, error) {
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	bucket, err := lease.BindBucket(bctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas})
	cancel()
	if err != nil {
		return nil, nil, nil, err
	}
	turn, err := lease.New(bucket, lease.Config{Key: ownership.SetupKey, Holder: holder, TTL: s.cfg.LeaseTTL,
		Logger: s.logger.With(slog.String("component", "lease"), slog.String("lease", ownership.SetupKey))})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := turn.Acquire(ctx); err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := turn.Release(rctx); err != nil {
			s.logger.Warn("setup lease not released; the next replica takes it after the lease TTL", slog.Any("error", err))
		}
	}()
	return s.setup(ctx)
}

// setup creates or updates every stream, the offsets and lease buckets
// ([resource.Setup]), keeps the hop secret and the partition boundaries,
// and returns the level streams to scan: the table's, the immediate
// level's, and any DELAYD_<duration> stream left from an earlier table.
func (s *Service) setup(ctx context.Context) ([]string, *offsets.Store, *lease.Bucket, error) {
	st, err := resource.Setup(ctx, mustJS(s.nc, 0), resource.Config{
		Prefix: s.cfg.Prefix, Levels: s.cfg.Levels, Partitions: s.cfg.Partitions, IngressPartitions: s.cfg.IngressPartitions,
		Replicas: s.cfg.Replicas, KeepAnswers: s.cfg.AnswerKeep != AnswerKeepOff, AnswerKeep: s.cfg.AnswerKeep,
		AnswerMaxBytes: s.cfg.AnswerMaxBytes, Logger: s.logger, Hooks: resource.Hooks{IngressChanging: s.hooks.ingressChanging},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	s.parts.hopKey, s.parts.boundaries = st.HopKey, st.Boundaries
	return st.Streams, st.Offsets, st.Leases, nil
}

// mustJS returns a JetStream context with its own async-publish window, so
// that one level's slow target never stalls another's publishes.
func mustJS(nc *nats.Conn, maxPending int) jetstream.JetStream {
	opts := []jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(publishAsyncTimeout)}
	if maxPending > 0 {
		opts = append(opts, jetstream.WithPublishAsyncMaxPending(maxPending))
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		panic(err) // only invalid options fail, and these are constant
	}
	return js
}
