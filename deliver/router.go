package deliver

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/levels"
)

// Router defaults.
const (
	// RouterMaxInFlightDefault bounds level-stream writes awaiting their PubAck.
	RouterMaxInFlightDefault = 4096
	// RouterBatchDefault is how many ingress messages are pulled ahead.
	RouterBatchDefault = 1024
	// RouterConsumer is the durable name of the ingress consumer of a
	// router on its own ([NewRouter]), and the prefix of a [Service]'s,
	// which is per term of the router lease: "delayd-router-<epoch>"
	// ([RouterConsumerName]). Earlier versions used it unsuffixed; a new
	// term deletes that one too.
	RouterConsumer = "delayd-router"
)

// The defaults are the router's (routing.MaxInFlightDefault…), written out
// here for go doc; this fails to compile if the two differ.
const _ = uint(RouterMaxInFlightDefault-routing.MaxInFlightDefault) + uint(routing.MaxInFlightDefault-RouterMaxInFlightDefault) +
	uint(RouterBatchDefault-routing.BatchDefault) + uint(routing.BatchDefault-RouterBatchDefault) +
	uint(ScannerStallAfterDefault-routing.StallAfterDefault) + uint(routing.StallAfterDefault-ScannerStallAfterDefault)

// RouterConsumer is the router's name too; this fails to compile (a
// duplicate key) if the two differ.
var _ = map[bool]int{false: 0, RouterConsumer == routing.RouterConsumer: 1}

// RouterConfig configures a [Router].
type RouterConfig struct {
	// Prefix is the ingress subject prefix. Required.
	Prefix string

	// Levels is the level table. Required.
	Levels levels.Table

	// Targets is the operator's target policy. Optional. Default allows all.
	Targets contract.TargetPolicy

	// Partitions splits levels of Levels into partition streams: a message
	// for a partitioned level goes to partition [levels.PartitionOf] of its
	// partition key (its Delay-Partition-Key, else its target subject).
	// Optional. Default: none. With ingress partitions
	// ([levels.Partitions.WithIngress], N above 1) the router routes
	// IngressPartition only, and writes only the level streams of that
	// partition (partition j of a level where j mod N is IngressPartition);
	// among those it picks by the partition key's hash.
	Partitions levels.Partitions

	// IngressPartition is the ingress partition the router routes, 0 to
	// N-1: its consumer reads the subjects "delayd.in.<IngressPartition>.>"
	// of DELAYD_INGRESS. Optional. Default 0 (the only one when ingress is
	// not partitioned).
	IngressPartition int

	// MaxDelay is the longest Delay-Duration, or Delay-Deliver-At ahead of
	// the ingress store time, delayd accepts. Optional. Default
	// [contract.MaxDelayDefault].
	MaxDelay time.Duration

	// Replicas for a level stream the router has to recreate because it was
	// deleted while delayd ran. Optional. Default 1.
	Replicas int

	// Logger is optional. Default discards.
	Logger *slog.Logger

	// MaxInFlight bounds level writes awaiting PubAck. Optional. Default
	// [RouterMaxInFlightDefault].
	MaxInFlight int

	// Batch is how many ingress messages are pulled ahead. Optional. Default
	// [RouterBatchDefault].
	Batch int

	// OnRouted is called with a level stream's name and a sequence it now
	// holds, for observers such as metrics: after each confirmed level
	// write, with the sequence the write got, and after each tail sync (at
	// the start of a session and before a retry), with the stream's last
	// sequence. (Scanners need no nudge: their pending pull request
	// receives the message.) Calls come from one goroutine, the router's
	// acker, one at a time, in ingress order; it must not block, as the
	// acker acks nothing meanwhile. Optional.
	OnRouted func(stream string, seq uint64)
}

// routing returns c as the router's config, field for field but OnRouted,
// which the router is given as its [routing.Tails] (NewRouter);
// TestRouterConfigFields checks that no other field is left out.
func (c RouterConfig) routing() routing.Config {
	return routing.Config{
		Prefix: c.Prefix, Levels: c.Levels, Targets: c.Targets, Partitions: c.Partitions, IngressPartition: c.IngressPartition,
		MaxDelay: c.MaxDelay, Replicas: c.Replicas, Logger: c.Logger, MaxInFlight: c.MaxInFlight, Batch: c.Batch,
	}
}

// RouterStats are the router's counters since start.
type RouterStats struct {
	Routed       uint64 // messages written to a level stream and acked at ingress
	DeadLettered uint64 // invalid messages written to DELAYD_DLQ
	Clamped      uint64 // Delay-Level above the table, clamped to the highest level
	Skipped      uint64 // redeliveries already present in their level stream
	Merged       uint64 // messages merged into a pending one with the same merge key and target
	IndexErrors  uint64 // id index writes that failed (those messages cannot be cancelled)
	Owner        bool   // this replica holds the router lease and routes now
	Epoch        uint64 // the epoch of this replica's last term of the router lease; 0 if it never held it

	// IngressPartition is the ingress partition the router routes (0 when
	// ingress is not partitioned); Lease is its lease key, "router" or
	// "router.<IngressPartition>".
	IngressPartition int    `json:",omitempty"`
	Lease            string `json:",omitempty"`

	// FencedWrites counts, by level stream, the router's terms that ended
	// because a router of a newer term had written that level stream (its
	// epoch marker, or messages past this router's last write), also when
	// the refusal of a write expecting the old tail came after the term
	// ended; and under [IngressStream], those that found a newer term's
	// ingress consumer. Each stopped the router in this process; each term
	// counts once.
	FencedWrites map[string]uint64 `json:",omitempty"`
}

// Router consumes DELAYD_INGRESS and writes each message to its level
// stream, or to DELAYD_DLQ with the reason when it is invalid.
//
// Exactly-once into level streams without a duplicate window: the router is
// the only writer of each level stream (one at a time: the router lease, and
// the epoch markers of marker.go that refuse a stale router's writes) and
// writes with Nats-Expected-Last-Sequence, so a level stream holds its
// messages in strict ingress order. The ingress message is acked only after the level write's
// PubAck. After a crash or a failed write, the router reads the ingress
// sequence of each level stream's last message (the scanners never purge a
// level stream's last message): any ingress message at or below it is
// already stored and is only acked. This costs no server memory per message,
// unlike a Nats-Msg-Id duplicate window.
//
// Its parts: a pure classifier (classify.go) decides each message's
// placement; the write pipeline (pipeline.go) sends the writes and confirms
// them in order on its acker goroutine; the merge cache (mergecache.go)
// remembers merge keys' placements under its own lock. The rest runs on
// the goroutine that calls [Router.Run].
type Router struct {
	r *routing.Router // the router (deliver/internal/routing), of which Router is the exported shape
}

// NewRouter returns a router on its own, outside a [Service], for example
// to measure routing alone. The streams must exist; see [Service]. Such a
// router trusts no hop (its hop key is its own, random, so a message
// carrying Delayd-Origin is routed as a new message), merges nothing (no
// scanner can say a merge key's message is pending), re-indexes every
// candidate at start, and counts dead letters only in [Router.Stats]. A
// [Service] builds its router with its hop key and scanners.
func NewRouter(js jetstream.JetStream, cfg RouterConfig) (*Router, error) {
	var tails routing.Tails
	if cfg.OnRouted != nil {
		tails = routing.TailsFunc(cfg.OnRouted)
	}
	r, err := routing.NewStandalone(js, cfg.routing(), tails)
	if err != nil {
		return nil, err
	}
	return &Router{r: r}, nil
}

// Stats returns the router's counters.
func (r *Router) Stats() RouterStats { return RouterStats(r.r.Stats()) }

// Run routes until ctx is done, then lets in-flight writes finish (or
// abandons them: their ingress messages stay unacked and are routed again,
// without duplicates, on the next start) and returns nil. It survives server
// restarts and reconnects; it returns an error only for a bad setup.
func (r *Router) Run(ctx context.Context) error { return r.r.Run(ctx) }

// RouterConsumerName returns the durable name of the router's ingress
// consumer in a term of epoch: "delayd-router-<epoch>", or [RouterConsumer]
// for epoch 0 (a router on its own, without a lease).
func RouterConsumerName(epoch uint64) string { return routing.RouterConsumerName(epoch) }
