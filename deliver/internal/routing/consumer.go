package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// RouterConsumerName returns the durable name of the router's ingress
// consumer in a term of epoch: "delayd-router-<epoch>", or [RouterConsumer]
// for epoch 0 (a router on its own, without a lease).
func RouterConsumerName(epoch uint64) string {
	if epoch == 0 {
		return RouterConsumer
	}
	return RouterConsumer + "-" + strconv.FormatUint(epoch, 10)
}

// routerConsumerEpoch returns the epoch in a router consumer's name: 0 for
// [RouterConsumer] itself; false for a name that is not a router's.
func routerConsumerEpoch(name string) (uint64, bool) {
	if name == RouterConsumer {
		return 0, true
	}
	rest, ok := strings.CutPrefix(name, RouterConsumer+"-")
	if !ok {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil
}

// LeaseKey returns the key of the router's lease: "router", or
// "router.<ingress partition>" when ingress is partitioned.
func (r *Router) LeaseKey() string {
	if r.share.parts > 1 {
		return ownership.RouterPartitionKey(r.share.part)
	}
	return ownership.RouterKey
}

// consumerName returns the durable name of the router's ingress consumer
// in a term of epoch: [RouterConsumerName] when ingress is not
// partitioned, else "delayd-router-p<ingress partition>-<epoch>".
func (r *Router) consumerName(epoch uint64) string {
	if r.share.parts > 1 {
		return RouterConsumer + "-p" + strconv.Itoa(r.share.part) + "-" + strconv.FormatUint(epoch, 10)
	}
	return RouterConsumerName(epoch)
}

// consumerEpoch returns the epoch in the name of one of this router's
// ingress consumers (of its ingress partition); false for any other name.
func (r *Router) consumerEpoch(name string) (uint64, bool) {
	if r.share.parts < 2 {
		return routerConsumerEpoch(name)
	}
	rest, ok := strings.CutPrefix(name, RouterConsumer+"-p"+strconv.Itoa(r.share.part)+"-")
	if !ok {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil
}

// resetConsumers deletes this term's ingress consumer if an earlier session
// left it (a fresh consumer redelivers every unacked ingress message at
// once, instead of after the ack wait) and every router consumer of an
// older term, and returns this term's consumer name. They go before the
// new one is created: the ingress stream is a work queue, which takes one
// unfiltered consumer at a time. A consumer of a newer term means a newer
// router runs: this one is fenced. (So a stale router can never delete the
// consumer of a newer term, nor create its own beside it.)
func (r *Router) resetConsumers(ctx context.Context, ingress jetstream.Stream) (string, error) {
	mine := r.consumerName(r.run.term.Epoch)
	lctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	names := ingress.ConsumerNames(lctx)
	var old []string
	for name := range names.Name() {
		e, ok := r.consumerEpoch(name)
		switch {
		case !ok:
		case e > r.run.term.Epoch && r.run.term.Epoch > 0:
			r.stats.fencedIngress.Add(1)
			return "", fmt.Errorf("%w: the ingress consumer %s of term %d exists, this router's term is %d", errRouterFenced, name, e, r.run.term.Epoch)
		case name == mine || (e < r.run.term.Epoch && r.run.term.Epoch > 0):
			old = append(old, name)
		}
	}
	if err := names.Err(); err != nil {
		return "", fmt.Errorf("list ingress consumers: %w", err)
	}
	for _, name := range old {
		if err := r.deps.js.DeleteConsumer(ctx, resource.IngressStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return "", fmt.Errorf("reset ingress consumer %s: %w", name, err)
		}
		if name != mine {
			r.logger.Info("deleted the ingress consumer of an earlier router term", slog.String("consumer", name))
		}
	}
	return mine, nil
}
