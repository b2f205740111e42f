package natstest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// TestClusteredWrongLastMsgIDHaltsStream records why delayd's router does
// not chain its level writes by Nats-Expected-Last-Msg-Id
// (docs/design.md#re-sent-writes-to-a-hung-leader): on a replicated
// stream, nats-server v2.15.2 checks that header only when each replica
// applies the write, and a refusal there ends the stream's apply loop
// ("last msgid mismatch" is not one of the errors it carries on after),
// so every later write goes unanswered. A standalone server refuses the
// write and carries on. When this test fails, the server changed: the
// chain may then be reconsidered.
func TestClusteredWrongLastMsgIDHaltsStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped under testing.Short()")
	}
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, js := c.Connect(0)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CHAIN", Subjects: []string{"chain.>"}, Replicas: 3, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	pub := func(id, expect string) error {
		m := &nats.Msg{Subject: "chain.x", Header: nats.Header{}, Data: []byte(id)}
		m.Header.Set(jetstream.MsgIDHeader, id)
		if expect != "" {
			m.Header.Set(jetstream.ExpectedLastMsgIDHeader, expect)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, m)
		return err
	}
	if err := pub("a", ""); err != nil {
		t.Fatal(err)
	}
	var apiErr *jetstream.APIError
	if err := pub("b", "zzz"); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10070 {
		t.Fatalf("write expecting a wrong last msg id: %v, want the refusal 10070", err)
	}
	// The next write names the right last id: a standalone server stores
	// it; this cluster does not answer it.
	if err := pub("c", "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("write after the refusal: %v; want no answer (the stream's apply loop ended). The server changed: see the comment", err)
	}
}
