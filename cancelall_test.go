package delayd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// TestCancelAll runs the Go client against a running delayd: three
// messages of orders.remind are cancelled and counted, the one of
// orders.close is not (it is still listed, and still cancellable by id);
// a second request finds nothing; a wildcard target is refused before a
// request.
func TestCancelAll(t *testing.T) {
	nc, stop := runDelayd("1s 1h")
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, target := range []string{"orders.remind", "orders.close", "orders.remind", "orders.remind"} {
		if _, err := delayd.Publish(ctx, js, target, []byte("x"), delayd.WithDuration(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := delayd.CancelAll(ctx, nc, "orders.remind")
	if want := (delayd.CancelAllResult{Cancelled: 3, Complete: true}); err != nil || res != want {
		t.Fatalf("CancelAll orders.remind: %+v %v, want %+v", res, err, want)
	}
	if res, err := delayd.CancelAll(ctx, nc, "orders.remind"); err != nil || res != (delayd.CancelAllResult{Complete: true}) {
		t.Errorf("CancelAll orders.remind again: %+v %v, want none cancelled", res, err)
	}
	page, err := delayd.ListPending(ctx, nc, "orders.close")
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("orders.close lists %v %v, want its one message", page, err)
	}
	if r, err := delayd.Cancel(ctx, nc, "orders.close", page.Items[0].ID); err != nil || r != delayd.Cancelled {
		t.Errorf("cancel of orders.close's message: %v %v", r, err)
	}
	if _, err := delayd.CancelAll(ctx, nc, "orders.>"); !errors.Is(err, delayd.ErrInvalidTarget) {
		t.Errorf("wildcard target: %v, want ErrInvalidTarget", err)
	}
}
