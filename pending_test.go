package delayd_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// TestListPending runs the Go client against a running delayd: pages of
// two follow Next to the end, each message once in due order with its id
// as Publish returned it; a bad limit is refused before a request.
func TestListPending(t *testing.T) {
	nc, stop := runDelayd("1s 1h")
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var want []string
	for _, d := range []time.Duration{3 * time.Hour, time.Hour, 2 * time.Hour} {
		id, err := delayd.Publish(ctx, js, "orders.remind", []byte("meeting"), delayd.WithDuration(d), delayd.WithMsgID("remind-"+d.String()))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	want = []string{want[1], want[2], want[0]} // by due
	var (
		got    []string
		cursor string
	)
	for range 3 {
		page, err := delayd.ListPending(ctx, nc, "orders.remind", delayd.WithLimit(2), delayd.WithCursor(cursor), delayd.WithPayload())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.Items {
			got = append(got, m.ID)
			if string(m.Data) != "meeting" || m.Target != "orders.remind" {
				t.Errorf("item %s: data %q, target %q", m.ID, m.Data, m.Target)
			}
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("pages: %q, want %q", got, want)
	}
	first, err := delayd.ListPending(ctx, nc, "orders.remind", delayd.WithLimit(1))
	if err != nil || !first.HasTotal || first.Total != 3 || len(first.Items) != 1 || !first.NextDue.Equal(first.Items[0].Due) {
		t.Errorf("first page: %+v, %v; want total 3 and next due its item's", first, err)
	}
	if _, err := delayd.Publish(ctx, js, "billing.run", []byte("bill"), delayd.WithDuration(time.Hour)); err != nil {
		t.Fatal(err)
	}
	all, err := delayd.ListPendingAny(ctx, nc, "orders.>")
	if err != nil || !all.HasTotal || all.Total != 3 || len(all.Items) != 3 || all.Items[0].Target != "orders.remind" {
		t.Errorf("ListPendingAny orders.>: %+v, %v; want orders.remind's 3", all, err)
	}
	if all, err := delayd.ListPendingAny(ctx, nc, ""); err != nil || all.Total != 4 || len(all.Items) != 4 {
		t.Errorf("ListPendingAny every target: %+v, %v; want 4", all, err)
	}
	if _, err := delayd.ListPending(ctx, nc, "orders.remind", delayd.WithLimit(delayd.PendingLimitMax+1)); !errors.Is(err, delayd.ErrBadPendingRequest) {
		t.Errorf("limit above max: %v, want ErrBadPendingRequest", err)
	}
	var pe *delayd.PendingError
	if _, err := delayd.ListPending(ctx, nc, "orders.remind", delayd.WithCursor("not-a-cursor")); !errors.Is(err, delayd.ErrBadPendingRequest) || !errors.As(err, &pe) || pe.Status != 400 {
		t.Errorf("bad cursor: %v, want a 400 answer", err)
	}
	if _, err := delayd.ListPending(ctx, nc, "orders.>"); !errors.Is(err, delayd.ErrInvalidTarget) {
		t.Errorf("wildcard target: %v, want ErrInvalidTarget", err)
	}
}
