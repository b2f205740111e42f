package itest

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// TryPublish publishes through JetStream and returns the PubAck's sequence
// or the error, without failing the test. A subject the server drops gets
// no PubAck, so the timeout is short.
func (b *Bundle) TryPublish(subject string, data []byte, hdr nats.Header) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ack, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}
