package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// TestDeliveryIDNotGuessable: a publisher that learns the ingress stream's
// creation time (it is in derived ids) and predicts another message's
// ingress sequence sends its own message first under that message's
// derived id; a stream-bound target must still store both.
func TestDeliveryIDNotGuessable(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 1s")
	b.CreateStream("TGT", "tgt.>")
	info, err := b.JS.Stream(context.Background(), deliver.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	created := info.CachedInfo().Created.UnixNano()
	next := b.Publish("delay.probe.x", nil, itest.Level(1)) + 2 // the victim's sequence, after the attacker's
	hdr := itest.Level(1)
	hdr.Set("Nats-Msg-Id", fmt.Sprintf("delayd-%d-%d", created, next))
	b.Publish("delay.tgt.x", []byte("attacker"), hdr)
	if seq := b.Publish("delay.tgt.x", []byte("victim"), itest.Level(2)); seq != next {
		t.Fatalf("victim at ingress sequence %d, want %d", seq, next)
	}
	itest.WaitFor(t, 10*time.Second, "both stored at the target", func() bool { return b.StreamCount("TGT") == 2 })
}

// bigBundle runs delayd on a server whose max payload is 8 KiB, so that a
// message can fit its first level but not its next hop (delayd adds
// headers as it moves on).
func bigBundle(t *testing.T) *itest.Bundle {
	dir := t.TempDir()
	opts := natstest.Options(dir)
	opts.MaxPayload = 8192
	b := &itest.Bundle{T: t, StoreDir: dir, Srv: natstest.Start(t, opts)}
	b.Connect()
	b.StartDelayd("200ms 1s")
	return b
}

// TestCancelDeadLetteredHop: cascading messages dead-lettered as too large
// on the way (by the scanner moving them on, or by the router placing the
// hop) answer "not found" to a cancel at once, and free their merge key: a
// later message with the key is delivered.
func TestCancelDeadLetteredHop(t *testing.T) {
	t.Parallel()
	b := bigBundle(t)
	c := b.Collect("big.>")
	var ids []string
	for k := 160; k <= 232; k += 8 { // sizes around the limit of a hop
		id := fmt.Sprintf("big-%d", k)
		hdr := nats.Header{contract.HeaderDuration: []string{"1500ms"}, "Nats-Msg-Id": []string{id}, contract.HeaderMergeKey: []string{id}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: "delay.big." + id, Data: bytes.Repeat([]byte("a"), 8192-120-k), Header: hdr})
		cancel()
		if err == nil {
			ids = append(ids, id)
		}
	}
	itest.WaitFor(t, 20*time.Second, "every message delivered or dead-lettered", func() bool {
		return uint64(len(c.Snapshot()))+b.StreamCount(deliver.DLQStream) == uint64(len(ids))
	})
	var dead []string
	for _, m := range b.StreamMsgs(deliver.DLQStream) {
		dead = append(dead, strings.TrimPrefix(m.Header.Get(contract.HeaderSubject), "delay.big."))
	}
	if len(dead) == 0 {
		t.Fatal("no hop was too large: the sizes no longer straddle the limit")
	}
	for _, id := range dead {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		began := time.Now()
		r, err := delayd.Cancel(ctx, b.NC, "big."+id, id)
		// "busy; try again" (the lookups' CPU share is used up, as under a
		// loaded CI machine) is retried, as docs/guide.md#cancel tells a caller to.
		for errors.Is(err, delayd.ErrCancelBusy) && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			r, err = delayd.Cancel(ctx, b.NC, "big."+id, id)
		}
		cancel()
		if err != nil || r != delayd.NotFound {
			t.Errorf("cancel of dead-lettered %s: %q %v after %s, want not found", id, r, err, time.Since(began).Round(time.Millisecond))
		}
		b.Publish("delay.big."+id, []byte("second"), nats.Header{contract.HeaderDuration: []string{"100ms"}, contract.HeaderMergeKey: []string{id}})
	}
	itest.WaitFor(t, 10*time.Second, "the later messages with their keys delivered", func() bool {
		n := 0
		for _, r := range c.Snapshot() {
			if string(r.Msg.Data) == "second" {
				n++
			}
		}
		return n == len(dead)
	})
}
