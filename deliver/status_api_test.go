package deliver

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
)

// TestStatusDecidedByOwner: a status request taken by a replica that owns
// no level is decided by the level's owner, through its decide subject
// (op "status"): a pending message answers pending with its due time and
// stays pending (it is delivered, later), a cancelled one cancelled.
func TestStatusDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	_, c := b.splitOwners()
	b.publishTo("tgt.s", "stays", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"s-pending"}})
	b.publishTo("tgt.s", "goes", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"s-cancelled"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	published := time.Now()
	answer, due, err := c.svc.decideID(ctx, reader, "s-pending", "tgt.s", time.Time{}, true)
	if err != nil || answer != level.AnswerPending {
		t.Fatalf("status of s-pending through B (no level owned): %v %v, want pending", answer, err)
	}
	// Level 2 is 5 s: due about 5 s after the publish, by the server's clock.
	if lo, hi := published.Add(3*time.Second), published.Add(7*time.Second); due.Before(lo) || due.After(hi) {
		t.Errorf("status of s-pending: due %s, want between %s and %s", due, lo, hi)
	}
	if answer, _, err := c.svc.decideID(ctx, reader, "s-cancelled", "tgt.s", time.Time{}, false); err != nil || answer != level.AnswerCancelled {
		t.Fatalf("cancel of s-cancelled through B: %v %v", answer, err)
	}
	if answer, _, err := c.svc.decideID(ctx, reader, "s-cancelled", "tgt.s", time.Time{}, true); err != nil || answer != level.AnswerCancelled {
		t.Errorf("status of s-cancelled through B: %v %v, want cancelled", answer, err)
	}
	got := b.waitPayload("stays", time.Minute)
	if contains(got, "goes") {
		t.Errorf("the cancelled message was delivered: TGT holds %q", got)
	}
	if answer, _, err := c.svc.decideID(ctx, reader, "s-pending", "tgt.s", time.Time{}, true); err != nil || answer != level.AnswerDelivered {
		t.Errorf("status of s-pending after its delivery: %v %v, want delivered", answer, err)
	}
}

// TestDeliveredIDOtherIngressLife: a delivered id (delayd-<ingress
// created>-<seq>-<MAC>, with a valid MAC) whose ingress part is another
// life of DELAYD_INGRESS names no message of this one, even one with the
// same sequence: cancel and status answer not found, and the message of
// that sequence is not cancelled (it is delivered). The same id with the
// stream's own life is that message.
func TestDeliveredIDOtherIngressLife(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	_, c := b.splitOwners()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "delay.tgt.s", Data: []byte("kept"), Header: nats.Header{contract.HeaderLevel: {"2"}}})
	if err != nil {
		t.Fatal(err)
	}
	str, err := b.js.Stream(ctx, IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	life := str.CachedInfo().Created.UnixNano()
	// The key as the Service reads it, so the MAC is valid: only the life
	// differs, as a delivered id kept from before the stream was created
	// again.
	key, err := hop.Load(ctx, b.js, nil)
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Sequence, 10)
	old := key.DeliveryID("delayd-" + strconv.FormatInt(life-1, 10) + "-" + seq)
	own := key.DeliveryID("delayd-" + strconv.FormatInt(life, 10) + "-" + seq)
	reader, err := jswire.NewBatchReader(c.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if answer, _, err := c.svc.decideID(ctx, reader, old, "tgt.s", time.Time{}, true); err != nil || answer != level.AnswerGone {
		t.Errorf("status of %q (another ingress life): %v %v, want not found", old, answer, err)
	}
	if answer, _, err := c.svc.decideID(ctx, reader, old, "tgt.s", time.Time{}, false); err != nil || answer != level.AnswerGone {
		t.Errorf("cancel of %q (another ingress life): %v %v, want not found", old, answer, err)
	}
	if answer, _, err := c.svc.decideID(ctx, reader, own, "tgt.s", time.Time{}, true); err != nil || answer != level.AnswerPending {
		t.Errorf("status of %q (this ingress life): %v %v, want pending", own, answer, err)
	}
	b.waitPayload("kept", time.Minute)
}
