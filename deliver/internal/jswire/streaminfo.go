package jswire

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
)

// StreamInfo is js.Stream (the stream's info, which only its leader
// answers) within OpTimeout, sent again every hedge.AfterLeader while
// unanswered: a leader that hangs never answers, and the request sent
// again reaches the new leader once JetStream has elected one.
func StreamInfo(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	return hedge.Do(ctx, hedge.AfterLeader, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
}
