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
	"github.com/delayd/delayd/internal/hedge"
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
	names, err := ingressRequest(ctx, r, "list", func(ctx context.Context) ([]string, error) {
		l := ingress.ConsumerNames(ctx)
		var names []string
		for name := range l.Name() {
			names = append(names, name)
		}
		return names, l.Err()
	})
	if err != nil {
		return "", fmt.Errorf("list ingress consumers: %w", err)
	}
	var old []string
	for _, name := range names {
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
	for _, name := range old {
		// A delete sent again after its first try was applied, but its
		// answer lost, finds no consumer: done.
		_, err := ingressRequest(ctx, r, "delete", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, r.deps.js.DeleteConsumer(ctx, resource.IngressStream, name)
		})
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return "", fmt.Errorf("reset ingress consumer %s: %w", name, err)
		}
		if name != mine {
			r.logger.Info("deleted the ingress consumer of an earlier router term", slog.String("consumer", name))
		}
	}
	return mine, nil
}

// ingressRequest makes a request about the ingress stream's consumers
// (list, delete, create: only JetStream's meta leader answers them) within
// [jswire.OpTimeout], sent again every [hedge.AfterLeader] while
// unanswered ([hedge.Do]): a leader that hangs never answers, and the
// request sent again reaches the new leader once JetStream has elected
// one, instead of restarting the router's session after the whole
// timeout. Each is one the server may apply twice: a list reads, a delete
// of a consumer already deleted finds none, and a create of a consumer
// with the same config is an update that changes nothing. op names the
// request for the test hook (hooks.loseAnswer).
func ingressRequest[T any](ctx context.Context, r *Router, op string, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	return hedge.Do(ctx, hedge.AfterLeader, func(ctx context.Context) (T, error) {
		v, err := fn(ctx)
		if lose := r.hooks.loseAnswer; lose != nil && lose(op) {
			<-ctx.Done() // the answer is lost: the try waits as one nobody answered
			var zero T
			return zero, ctx.Err()
		}
		return v, err
	})
}
