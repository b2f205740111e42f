package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/backoff"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/offsets"
)

// joinUntilOK joins the replicas before touching any stream
// ([ownership.Service.Join]: a replica whose level table, prefix or replica
// count differs from a live one's must change nothing), retrying with
// backoff until it succeeds. ok is false when Run must return err: nil if
// ctx ended, an error wrapping [ErrReplicaMismatch], or a permanent one.
func (s *Service) joinUntilOK(ctx context.Context, own *ownership.Service) (ok bool, err error) {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		err := own.Join(ctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas}, s.sharedSettings())
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, nil
		}
		if errors.Is(err, lease.ErrMismatch) {
			return false, fmt.Errorf("%w: %w", ErrReplicaMismatch, err)
		}
		if err := s.permanent(err); err != nil {
			return false, err
		}
		s.logger.Warn("joining the replicas failed; retrying", slog.Any("error", err))
		if !retry.Sleep(ctx) {
			return false, nil
		}
	}
}

// setupState is what setup made that Run builds on: the level streams
// to scan, the offsets store and the lease bucket.
type setupState struct {
	streams []string
	store   *offsets.Store
	bucket  *lease.Bucket
}

// setupUntilOK runs setup in this replica's turn
// ([ownership.Service.SetupTurn]), retrying with backoff until it
// succeeds. A nil state means Run must return err: nil if ctx ended, or
// an error no retry can mend (a foreign hop secret, a changed ingress
// partition count, a permanent one).
func (s *Service) setupUntilOK(ctx context.Context, own *ownership.Service) (*setupState, error) {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		var st setupState
		err := own.SetupTurn(ctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas}, func(ctx context.Context) error {
			var err error
			st.streams, st.store, st.bucket, err = s.setup(ctx)
			return err
		})
		if err == nil {
			return &st, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if errors.Is(err, ErrHopKey) || errors.Is(err, ErrIngressPartitionsChanged) {
			return nil, err // retrying cannot help: an operator must act
		}
		if err := s.permanent(err); err != nil {
			return nil, err
		}
		s.logger.Warn("setup failed; retrying", slog.Any("error", err))
		if !retry.Sleep(ctx) {
			return nil, nil
		}
	}
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

// resource keeps its own copies of these names; this fails to compile (a
// duplicate key false in the map literal) if they differ.
var _ = map[bool]int{false: 0, IngressStream == resource.IngressStream && RouterConsumer == resource.RouterConsumer: 1}

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
