package itest

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
)

// SetDLQLimit sets DELAYD_DLQ's max_msgs (-1: unlimited) with discard-new,
// as an operator would.
func (b *Bundle) SetDLQLimit(maxMsgs int64) {
	b.T.Helper()
	ctx := context.Background()
	s, err := b.JS.Stream(ctx, deliver.DLQStream)
	if err != nil {
		b.T.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = maxMsgs, jetstream.DiscardNew
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		b.T.Fatal(err)
	}
}

// IngressCount counts the ingress stream's messages on subject (a filter
// with wildcards).
func (b *Bundle) IngressCount(filter string) uint64 {
	b.T.Helper()
	s, err := b.JS.Stream(context.Background(), deliver.IngressStream)
	if err != nil {
		b.T.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(filter))
	if err != nil {
		b.T.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}
