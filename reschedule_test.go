package delayd_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
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

// TestReschedule moves messages on a running delayd through the Go client,
// and checks by the order of deliveries (no timing): a message moved twice
// (to 1h, then to 10s) is delivered once, after a marker due before its
// new due and after its old one, with its id, payload and headers,
// Delay-Rescheduled 2 and Delay-Due-At the answer's due, never before it;
// one moved to run now is delivered at once; one moved and then cancelled
// never is (a trailing marker due after every new due arrives without
// it); a reschedule after the delivery answers already delivered.
func TestReschedule(t *testing.T) {
	nc, stop := runDelayd("100ms 1s 1h")
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe("rs.>", got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = nc.Flush()
	publish := func(id string, d time.Duration) {
		t.Helper()
		if _, err := delayd.Publish(ctx, js, "rs.remind", []byte(id), delayd.WithDuration(d), delayd.WithMsgID(id),
			delayd.WithHeader(nats.Header{"Tenant": {"acme"}})); err != nil {
			t.Fatal(err)
		}
	}
	move := func(id string, when delayd.When) delayd.RescheduleResult {
		t.Helper()
		res, err := delayd.Reschedule(ctx, nc, "rs.remind", id, when)
		if err != nil || res.Result != delayd.Rescheduled || res.DueAt.IsZero() {
			t.Fatalf("reschedule %s %v: %+v %v, want rescheduled with its due", id, when, res, err)
		}
		return res
	}
	next := func() *nats.Msg {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(30 * time.Second): // a liveness bound
			t.Fatal("no delivery within 30 s")
			return nil
		}
	}

	publish("moved", 5*time.Second)
	publish("cancelled", time.Hour)
	move("moved", delayd.In(time.Hour))
	res := move("moved", delayd.In(10*time.Second))
	move("cancelled", delayd.In(2*time.Second))
	if r, err := delayd.Cancel(ctx, nc, "rs.remind", "cancelled"); err != nil || r != delayd.Cancelled {
		t.Fatalf("cancel of a rescheduled message: %v %v", r, err)
	}
	publish("before", 6*time.Second) // due after moved's old due, before its new one (unless these took 4 s)
	publish("after", 14*time.Second) // due after every new due
	run := time.Now()
	publish("now", time.Hour)
	now := move("now", delayd.Now())

	var order []string
	for len(order) < 4 {
		m := next()
		order = append(order, string(m.Data))
		switch string(m.Data) {
		case "moved":
			if m.Header.Get(delayd.HeaderRescheduled) != "2" || m.Header.Get(delayd.HeaderDueAt) != contract.FormatTime(res.DueAt) ||
				m.Header.Get("Nats-Msg-Id") != "moved" || m.Header.Get("Tenant") != "acme" {
				t.Errorf("moved's delivery headers %v; want Delay-Rescheduled 2, Delay-Due-At %s, its id and Tenant", m.Header, contract.FormatTime(res.DueAt))
			}
			if time.Now().Before(res.DueAt) {
				t.Errorf("moved delivered before its new due %s", res.DueAt)
			}
		case "now":
			if m.Header.Get(delayd.HeaderRescheduled) != "1" || m.Header.Get(delayd.HeaderDueAt) != contract.FormatTime(now.DueAt) || now.DueAt.Before(run.Add(-time.Minute)) ||
				len(m.Header.Values(delayd.HeaderHops)) != 0 {
				t.Errorf("run now's delivery headers %v, answer due %s; want Delay-Rescheduled 1, that due, no Delay-Hops (it never cascaded)", m.Header, now.DueAt)
			}
		}
	}
	// Run now's delivery may come anywhere before "after"'s.
	if i := slices.Index(order, "now"); i >= 0 && i < 3 {
		order = slices.Delete(order, i, i+1)
	}
	if want := []string{"before", "moved", "after"}; !slices.Equal(order, want) {
		t.Errorf("deliveries %q (now taken out), want %q (moved never at its old due, cancelled never)", order, want)
	}
	if r, err := delayd.Reschedule(ctx, nc, "rs.remind", "moved", delayd.In(time.Hour)); err != nil || r.Result != delayd.RescheduleDelivered {
		t.Errorf("reschedule after the delivery: %+v %v, want already delivered", r, err)
	}
	if r, err := delayd.Reschedule(ctx, nc, "rs.remind", "cancelled", delayd.Now()); err != nil || r.Result != delayd.RescheduleNotFound {
		t.Errorf("reschedule of a cancelled message: %+v %v, want not found", r, err)
	}
	select {
	case m := <-got:
		t.Errorf("a further delivery %q %v", m.Data, m.Header)
	default:
	}
}
