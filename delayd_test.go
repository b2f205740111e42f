package delayd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
)

func TestPublish(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	// The ingress stream as delayd creates it (no delayd running: the
	// message stays in ingress for inspection).
	ingress, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deliver.IngressStream, Subjects: []string{"delay.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := delayd.Publish(ctx, js, "orders.close", nil); !errors.Is(err, delayd.ErrNoDelay) {
		t.Errorf("no delay option: %v, want ErrNoDelay", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithLevel(-1)); !errors.Is(err, delayd.ErrInvalidLevel) {
		t.Errorf("level -1: %v, want ErrInvalidLevel", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithDuration(-time.Second)); !errors.Is(err, delayd.ErrInvalidDelay) || errors.Is(err, delayd.ErrInvalidLevel) {
		t.Errorf("duration -1s: %v, want ErrInvalidDelay and not ErrInvalidLevel (a bad level only)", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithLevel(1), delayd.WithMergeKey(" ")); !errors.Is(err, delayd.ErrInvalidMergeKey) || errors.Is(err, delayd.ErrInvalidLevel) {
		t.Errorf("blank merge key: %v, want ErrInvalidMergeKey and not ErrInvalidLevel", err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithLevel(1), delayd.WithDuration(time.Second)); !errors.Is(err, delayd.ErrAmbiguousDelay) {
		t.Errorf("level and duration: %v, want ErrAmbiguousDelay", err)
	}
	for _, target := range []string{"", "orders..close", "orders.*", "delay.x", "delayd.level.1S.x", "$KV.x"} {
		if _, err := delayd.Publish(ctx, js, target, nil, delayd.WithLevel(1)); !errors.Is(err, contract.ErrInvalidTarget) && !errors.Is(err, contract.ErrForbiddenTarget) {
			t.Errorf("target %q: %v, want the router's target error", target, err)
		}
	}

	id, err := delayd.Publish(ctx, js, "orders.close", []byte("x"), delayd.WithLevel(3),
		delayd.WithHeader(nats.Header{"delay-level": []string{"9"}, "X-Trace": []string{"a", "b"}}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ingress.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if id != "1" {
		t.Errorf("id = %q, want the ingress sequence \"1\"", id)
	}
	if m.Subject != "delay.orders.close" || m.Header.Get(delayd.HeaderLevel) != "3" || m.Header.Get("delay-level") != "" {
		t.Errorf("stored %s with headers %v: want delay.orders.close, one Delay-Level 3", m.Subject, m.Header)
	}
	if v := m.Header.Values("X-Trace"); len(v) != 2 || v[0] != "a" || v[1] != "b" {
		t.Errorf("X-Trace = %v, want [a b]", v)
	}
	id, err = delayd.Publish(ctx, js, "orders.close", nil, delayd.WithLevel(0), delayd.WithMsgID("mine"), delayd.WithPrefix("delay"))
	if err != nil || id != "mine" {
		t.Errorf("with a message id: %q, %v; want \"mine\"", id, err)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithDeliverAt(at)); err != nil {
		t.Fatal(err)
	}
	if _, err := delayd.Publish(ctx, js, "orders.close", nil, delayd.WithDuration(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint64][2]string{3: {delayd.HeaderDeliverAt, "2030-01-02T03:04:05.000000006Z"}, 4: {delayd.HeaderDuration, "1m30s"}} {
		m, err := ingress.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(want[0]); got != want[1] || m.Header.Get(delayd.HeaderLevel) != "" {
			t.Errorf("message %d: %s = %q (Delay-Level %q), want %q alone", seq, want[0], got, m.Header.Get(delayd.HeaderLevel), want[1])
		}
	}
}

// TestPublishReusedID moves a reminder the way a new user would: publish
// it with an id, cancel it, publish it again with the same id and a new
// delay. The ingress stream drops the second publish as a duplicate (its
// window is 2 min): Publish must say that nothing was stored, with an error
// matching ErrDuplicate that names the id and the window. A new id works.
// Against an embedded nats-server and a delayd service.
func TestPublishReusedID(t *testing.T) {
	t.Parallel()
	nc, stop := runDelayd("100ms 1s")
	t.Cleanup(stop)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	id, err := delayd.Publish(ctx, js, "remind.me", []byte("at 10"), delayd.WithDuration(time.Hour), delayd.WithMsgID("remind-7"))
	if err != nil || id != "remind-7" {
		t.Fatalf("first publish: %q, %v", id, err)
	}
	if res, err := delayd.Cancel(ctx, nc, "remind.me", id); res != delayd.Cancelled || err != nil {
		t.Fatalf("cancel: %q, %v", res, err)
	}
	id, err = delayd.Publish(ctx, js, "remind.me", []byte("at 11"), delayd.WithDuration(2*time.Hour), delayd.WithMsgID("remind-7"))
	var dup *delayd.DuplicateError
	if !errors.Is(err, delayd.ErrDuplicate) || !errors.As(err, &dup) || id != "" {
		t.Fatalf("publish again with the cancelled message's id: %q, %v; want an error matching ErrDuplicate", id, err)
	}
	if dup.ID != "remind-7" || dup.Stream != deliver.IngressStream || dup.Window != 2*time.Minute || dup.Sequence != 1 {
		t.Errorf("DuplicateError %+v, want id remind-7, stream %s, window 2m, the first message's sequence 1", *dup, deliver.IngressStream)
	}
	for _, s := range []string{`"remind-7"`, "2m0s", "nothing stored", deliver.IngressStream} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %s", err, s)
		}
	}
	if id, err := delayd.Publish(ctx, js, "remind.me", []byte("at 11"), delayd.WithDuration(2*time.Hour), delayd.WithMsgID("remind-8")); err != nil || id != "remind-8" {
		t.Errorf("publish with a new id: %q, %v", id, err)
	}
}
