package delayd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
)

// TestRescheduleRequests runs the Go client against a running delayd:
// each When is sent as its one delay header (seen by a subscriber beside
// delayd); an unknown id, and another target's, answer not found; a due
// beyond the max delay is delayd's 400, ErrInvalidDelay; a bad when, an
// empty id or a wildcard target are refused before any request.
func TestRescheduleRequests(t *testing.T) {
	nc, stop := runDelayd("1s 1h")
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := delayd.Publish(ctx, js, "orders.close", []byte("x"), delayd.WithDuration(time.Hour), delayd.WithMsgID("close-1")); err != nil {
		t.Fatal(err)
	}
	seen, err := nc.SubscribeSync(delayd.RescheduleSubjectFor(">"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Second).Add(6).In(time.FixedZone("x", 3600))
	for _, tc := range []struct {
		when          delayd.When
		header, value string
	}{
		{delayd.In(2 * time.Hour), delayd.HeaderDuration, "2h0m0s"},
		{delayd.At(at), delayd.HeaderDeliverAt, at.UTC().Format("2006-01-02T15:04:05.000000000Z")},
		{delayd.AtLevel(1), delayd.HeaderLevel, "1"},
		{delayd.Now(), delayd.HeaderDuration, "0s"},
	} {
		res, err := delayd.Reschedule(ctx, nc, "orders.remind", "remind-404", tc.when)
		if err != nil || res != (delayd.RescheduleResult{Result: delayd.RescheduleNotFound}) {
			t.Errorf("%v of an unknown id: %+v %v, want not found", tc.when, res, err)
		}
		req, err := seen.NextMsg(10 * time.Second) // a liveness bound
		if err != nil {
			t.Fatal(err)
		}
		if len(req.Header) != 1 || len(req.Header.Values(tc.header)) != 1 || req.Header.Get(tc.header) != tc.value || string(req.Data) != "remind-404" ||
			req.Subject != "delayd.api.reschedule.orders.remind" {
			t.Errorf("%v sent %s %q %v, want only %s: %s on delayd.api.reschedule.orders.remind", tc.when, req.Subject, req.Data, req.Header, tc.header, tc.value)
		}
	}
	// Scoped by target: orders.close's id is not found for orders.remind,
	// nor is it moved.
	if res, err := delayd.Reschedule(ctx, nc, "orders.remind", "close-1", delayd.In(2*time.Hour)); err != nil || res.Result != delayd.RescheduleNotFound {
		t.Errorf("another target's id: %+v %v, want not found", res, err)
	}
	if res, err := delayd.Reschedule(ctx, nc, "orders.close", "close-1", delayd.In(200*time.Hour)); !errors.Is(err, delayd.ErrInvalidDelay) ||
		errors.Is(err, delayd.ErrAmbiguousID) || res != (delayd.RescheduleResult{}) {
		t.Errorf("200h, beyond the max delay: %+v %v, want ErrInvalidDelay", res, err)
	}
	for range 2 {
		if _, err := seen.NextMsg(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	page, err := delayd.ListPending(ctx, nc, "orders.close")
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != "close-1" {
		t.Fatalf("orders.close lists %+v %v, want close-1 still pending", page, err)
	}
	for what, tc := range map[string]struct {
		target, id string
		when       delayd.When
		want       error
	}{
		"negative duration": {"orders.close", "close-1", delayd.In(-time.Second), delayd.ErrInvalidDelay},
		"zero time":         {"orders.close", "close-1", delayd.At(time.Time{}), delayd.ErrInvalidDelay},
		"negative level":    {"orders.close", "close-1", delayd.AtLevel(-1), delayd.ErrInvalidLevel},
		"no when":           {"orders.close", "close-1", delayd.When{}, delayd.ErrNoDelay},
		"wildcard target":   {"orders.>", "close-1", delayd.Now(), delayd.ErrInvalidTarget},
		"internal target":   {"delayd.x", "close-1", delayd.Now(), delayd.ErrForbiddenTarget},
	} {
		if _, err := delayd.Reschedule(ctx, nc, tc.target, tc.id, tc.when); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", what, err, tc.want)
		}
	}
	if _, err := delayd.Reschedule(ctx, nc, "orders.close", " ", delayd.Now()); err == nil {
		t.Error("an empty id was sent")
	}
	if req, err := seen.NextMsg(0); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a request was sent for a refused call, or more than one per call: %v %v", req, err)
	}
	// The operator's form, any target.
	if res, err := delayd.RescheduleAny(ctx, nc, "remind-404", delayd.Now()); err != nil || res.Result != delayd.RescheduleNotFound {
		t.Errorf("RescheduleAny of an unknown id: %+v %v, want not found", res, err)
	}
}
