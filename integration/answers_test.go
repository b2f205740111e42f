package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// churn publishes to a 1-level target every 50 ms until the test ends, so
// the levels' heads keep moving and the id index is trimmed.
func churn(t *testing.T, b *itest.Bundle) {
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond): // pacing the churn, not a correctness wait
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: "delay.churn.x", Header: itest.Level(1)})
				cancel()
				if err != nil {
					t.Errorf("churn publish: %v", err) // not t.Fatal: this is not the test's goroutine
					return
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-churned })
}

// waitIndexTrimmed waits until the id index no longer holds any record
// stored up to now: every record of a message that left its level by now
// is purged.
func waitIndexTrimmed(t *testing.T, b *itest.Bundle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := b.JS.Stream(ctx, deliver.IndexStream)
	if err != nil {
		t.Fatal(err)
	}
	last := st.CachedInfo().State.LastSeq
	itest.WaitFor(t, 60*time.Second, "the id index trimmed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := st.Info(ctx)
		return err == nil && info.State.FirstSeq > last
	})
}

// TestAnswersOutliveIndex: a delivered message and a cancelled one still
// answer "already delivered" and "cancelled" once the id index (kept 1 s
// here, as the old minute) has purged their records: the answers are kept
// for DELAYD_ANSWER_KEEP (default hours), not for the index's keep.
func TestAnswersOutliveIndex(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 3s", func(c *deliver.Config) { c.IndexKeep = time.Second })
	c := b.Collect("outlive.x")
	for _, id := range []string{"outlive-a", "outlive-m"} {
		hdr := itest.Level(2)
		hdr.Set("Nats-Msg-Id", id)
		b.Publish("delay.outlive.x", []byte(id), hdr)
	}
	if r := b.Cancel("outlive-m"); r != delayd.Cancelled {
		t.Fatalf("cancel outlive-m: %q", r)
	}
	churn(t, b)
	c.Wait(t, 1, 15*time.Second)
	waitIndexTrimmed(t, b)
	if r := b.Cancel("outlive-a"); r != delayd.AlreadyDelivered {
		t.Errorf("outlive-a after its index records were purged: %q, want already delivered", r)
	}
	if r := b.Cancel("outlive-m"); r != delayd.Cancelled {
		t.Errorf("outlive-m after its index records were purged: %q, want cancelled", r)
	}
	// A scoped request for another target still knows nothing of them.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if r, err := delayd.Cancel(ctx, b.NC, "other.x", "outlive-a"); err != nil || r != delayd.NotFound {
		t.Errorf("outlive-a in another target's scope: %q %v, want not found", r, err)
	}
}

// statusReq sends a raw status request on subject and returns the reply.
func statusReq(t *testing.T, b *itest.Bundle, subject, id string) *nats.Msg {
	t.Helper()
	m, err := b.NC.Request(subject, []byte(id), 15*time.Second)
	if err != nil {
		t.Fatalf("status %s %q: %v", subject, id, err)
	}
	return m
}

// TestStatusAPI: delayd.api.status.<target> answers without cancelling:
// a pending message is "pending" with its delivery time (not its next
// cascade hop's) in Delay-Due-At, and is still delivered; a cancelled one
// "cancelled", a delivered one "already delivered", an unknown id or
// another target's message "not found"; each with cancel's Delay-Status
// codes (pending: 202).
func TestStatusAPI(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1s 1h")
	c := b.Collect("st.x")
	// Due in 2 s exactly (whole seconds, so the header's text is exact):
	// placed in the 1 s level, it hops there before its delivery.
	due := time.Now().Add(2500 * time.Millisecond).Truncate(time.Second).UTC()
	hdr := nats.Header{}
	hdr.Set(contract.HeaderDeliverAt, due.Format(time.RFC3339))
	hdr.Set("Nats-Msg-Id", "st-pending")
	b.Publish("delay.st.x", []byte("pending"), hdr)
	hdr = itest.Level(3) // 1 h
	hdr.Set("Nats-Msg-Id", "st-cancelled")
	b.Publish("delay.st.x", []byte("cancelled"), hdr)
	if r := b.Cancel("st-cancelled"); r != delayd.Cancelled {
		t.Fatalf("cancel st-cancelled: %q", r)
	}

	m := statusReq(t, b, "delayd.api.status.st.x", "st-pending")
	if string(m.Data) != "pending" || m.Header.Get(contract.HeaderStatus) != "202" {
		t.Fatalf("status st-pending: %q %s %q, want pending 202", m.Data, contract.HeaderStatus, m.Header.Get(contract.HeaderStatus))
	}
	got, err := time.Parse(contract.TimeLayout, m.Header.Get(contract.HeaderDueAt))
	if err != nil || !got.Equal(due) {
		t.Errorf("status st-pending: %s %q, want %s", contract.HeaderDueAt, m.Header.Get(contract.HeaderDueAt), due.Format(contract.TimeLayout))
	}
	for _, w := range []struct{ subject, id, body, status string }{
		{"delayd.api.status.st.x", "st-cancelled", "cancelled", "200"},
		{"delayd.api.status", "st-cancelled", "cancelled", "200"}, // the operator's form
		{"delayd.api.status.st.x", "no-such-id", "not found", "404"},
		{"delayd.api.status.other.x", "st-pending", "not found", "404"}, // another target's scope
	} {
		m := statusReq(t, b, w.subject, w.id)
		if string(m.Data) != w.body || m.Header.Get(contract.HeaderStatus) != w.status {
			t.Errorf("%s %q: %q %q, want %q %q", w.subject, w.id, m.Data, m.Header.Get(contract.HeaderStatus), w.body, w.status)
		}
	}
	// Asking did not cancel it: it is delivered, then answers so.
	got2 := c.Wait(t, 1, 15*time.Second)
	if string(got2[0].Msg.Data) != "pending" {
		t.Fatalf("delivered %q, want pending", got2[0].Msg.Data)
	}
	m = statusReq(t, b, "delayd.api.status.st.x", "st-pending")
	if string(m.Data) != "already delivered" || m.Header.Get(contract.HeaderStatus) != "409" {
		t.Errorf("status st-pending after its delivery: %q %q, want already delivered 409", m.Data, m.Header.Get(contract.HeaderStatus))
	}
}

// TestDeliveredIDAccepted: the Nats-Msg-Id a message without a publisher
// id is delivered with (delayd-<ingress created>-<seq>-<MAC>) is accepted
// by cancel and status as the message's id; a forged one (a wrong MAC) is
// not found.
func TestDeliveredIDAccepted(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1h")
	b.CreateStream("DELIVID", "delivid.>")
	b.Publish("delay.delivid.x", []byte("x"), itest.Level(1))
	itest.WaitFor(t, 15*time.Second, "the delivery", func() bool { return b.StreamCount("DELIVID") == 1 })
	id := b.StreamMsgs("DELIVID")[0].Header.Get(jetstream.MsgIDHeader)
	if !strings.HasPrefix(id, "delayd-") {
		t.Fatalf("delivered Nats-Msg-Id %q", id)
	}
	if r := b.Cancel(id); r != delayd.AlreadyDelivered {
		t.Errorf("cancel %q (the delivered id): %q, want already delivered", id, r)
	}
	if m := statusReq(t, b, "delayd.api.status.delivid.x", id); string(m.Data) != "already delivered" {
		t.Errorf("status %q (the delivered id): %q, want already delivered", id, m.Data)
	}
	forged := id[:len(id)-1] + "A" // a MAC one character off
	if strings.HasSuffix(id, "A") {
		forged = id[:len(id)-1] + "B"
	}
	if r := b.Cancel(forged); r != delayd.NotFound {
		t.Errorf("cancel %q (a forged id): %q, want not found", forged, r)
	}
}
