package resource

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// Config is what [Setup] creates the resources for: the Service's
// settings, after its defaults and checks.
type Config struct {
	// Prefix is the ingress subject prefix ("<Prefix>.<target>"). Required.
	Prefix string
	// Levels is the level table. Required.
	Levels levels.Table
	// Partitions are the levels' partition counts, the ingress partitions
	// included ([levels.Partitions.WithIngress]).
	Partitions levels.Partitions
	// IngressPartitions is the ingress partition count N, at least 1.
	IngressPartitions int
	// Replicas for every stream and bucket, at least 1.
	Replicas int
	// KeepAnswers creates DELAYD_ANSWERS ([index.EnsureAnswerStream]) with
	// AnswerKeep and AnswerMaxBytes; false: kept answers are off.
	KeepAnswers    bool
	AnswerKeep     time.Duration
	AnswerMaxBytes int64
	// Logger is required (the Service's).
	Logger *slog.Logger
	// Hooks are tests' hooks; zero in production.
	Hooks Hooks
}

// Hooks are Setup's test hooks: each, if set, runs at one point of its
// work, on its goroutine.
type Hooks struct {
	// IngressChanging runs between the check that DELAYD_INGRESS is empty
	// and the update of its transform at a change of the ingress
	// partition count.
	IngressChanging func()
}

// State is what [Setup] found and made: what the Service runs on.
type State struct {
	// Streams are the level streams to scan: the table's, the immediate
	// level's, and any DELAYD_<duration> stream left from an earlier table.
	Streams []string
	// Offsets is the offsets bucket's store.
	Offsets *offsets.Store
	// Leases is the lease bucket.
	Leases *lease.Bucket
	// HopKey is the hop secret ([hop.Load]).
	HopKey hop.Key
	// Boundaries are, by level delay, the boundaries of its streams at the
	// last change of its partition count, while old messages may be
	// pending (docs/operations.md#partitions-for-hot-levels).
	Boundaries map[time.Duration]map[string]uint64
}

// Names of the JetStream resources and subjects Setup uses.
const (
	// IngressStream is the work-queue stream publishers write to
	// (deliver.IngressStream).
	IngressStream = "DELAYD_INGRESS"
	// RouterConsumer prefixes every router's ingress consumer name
	// (deliver.RouterConsumer).
	RouterConsumer = "delayd-router"

	dlqSubjects   = contract.DLQSubjectPrefix   // "delayd.dlq.<reason>"
	levelSubjects = contract.LevelSubjectPrefix // "delayd.level.<level name>.<target>"
)

// Setup creates or updates every stream, the offsets and lease buckets, and returns
// the level streams to scan: the table's, the immediate level's, and any
// DELAYD_<duration> stream left from an earlier table. js is used for
// synchronous calls only.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) (State, error) {
	var st State
	var err error
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r := cfg.Replicas
	if err := ensureIngress(ctx, js, cfg); err != nil {
		return State{}, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        message.DLQStream,
		Description: "delayd dead letters: invalid or undeliverable messages with Delay-Error and Delay-Subject",
		Subjects:    []string{dlqSubjects + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    r,
		Duplicates:  contract.DuplicateWindow,
	}); err != nil {
		return State{}, fmt.Errorf("stream %s: %w", message.DLQStream, err)
	}
	if err := index.EnsureStreams(ctx, js, r); err != nil {
		return State{}, err
	}
	if cfg.KeepAnswers {
		if err := index.EnsureAnswerStream(ctx, js, index.AnswerConfig{Keep: cfg.AnswerKeep, MaxBytes: cfg.AnswerMaxBytes, Replicas: r}); err != nil {
			return State{}, err
		}
	}
	want := append([]levels.Level{{}}, cfg.Levels.Levels()...)
	want = append(want, cfg.Levels.PrecisionLevels()...)
	var streams []string
	for _, l := range want {
		for _, name := range cfg.Partitions.Streams(l.Delay) {
			if err := EnsureLevelStream(ctx, js, name, l.Delay, r); err != nil {
				return State{}, err
			}
			streams = append(streams, name)
		}
	}
	names := js.StreamNames(ctx, jetstream.WithStreamListSubject(levelSubjects+">"))
	for name := range names.Name() {
		if _, ok := levels.ParseStreamName(name); ok && !slices.Contains(streams, name) {
			cfg.Logger.Info("draining level stream no longer in the table", slog.String("stream", name))
			streams = append(streams, name)
		}
	}
	if err := names.Err(); err != nil {
		return State{}, fmt.Errorf("list level streams: %w", err)
	}
	store, err := offsets.New(ctx, js, offsets.Config{Replicas: r, Logger: cfg.Logger.With(slog.String("component", "offsets"))})
	if err != nil {
		return State{}, err
	}
	if st.HopKey, err = hop.Load(ctx, js, cfg.Logger); err != nil {
		return State{}, err
	}
	existing := make(map[time.Duration][]string)
	for _, name := range streams {
		d, _ := levels.ParseStreamName(name)
		existing[d] = append(existing[d], name)
	}
	if st.Boundaries, err = partitionBoundaries(ctx, js, cfg, want, existing); err != nil {
		return State{}, err
	}
	bucket, err := lease.OpenBucket(ctx, js, lease.BucketConfig{Replicas: r})
	if err != nil {
		return State{}, err
	}
	st.Streams, st.Offsets, st.Leases = streams, store, bucket
	return st, nil
}

// EnsureLevelStream creates or updates the level stream name (a
// [levels.StreamName] or [levels.PartitionStreamName]) of delay, on the
// subjects "delayd.level.<name without DELAYD_>.>".
func EnsureLevelStream(ctx context.Context, js jetstream.JetStream, name string, delay time.Duration, replicas int) error {
	desc := "delayd level " + levels.FormatDuration(delay) + ": messages waiting for their due time"
	if _, part, _ := levels.ParseStream(name); part >= 0 {
		desc = fmt.Sprintf("delayd level %s, partition %d: messages waiting for their due time", levels.FormatDuration(delay), part)
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: desc,
		Subjects:    []string{levelSubjects + strings.TrimPrefix(name, levels.StreamPrefix) + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		// The router writes with Nats-Expected-Last-Sequence and no
		// Nats-Msg-Id, so the smallest window keeps no ids in memory.
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	return nil
}
