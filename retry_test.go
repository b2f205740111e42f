package delayd_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

func TestParseLadder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		text    string
		want    delayd.Ladder
		wantErr error
		errText string // a substring of the error
	}{
		{text: "1m 5m 10m 30m 1h", want: delayd.Ladder{time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour}},
		{text: "  100ms\t200ms\n", want: delayd.Ladder{100 * time.Millisecond, 200 * time.Millisecond}},
		{text: "30s 30s 30s", want: delayd.Ladder{30 * time.Second, 30 * time.Second, 30 * time.Second}}, // repeats allowed
		{text: "1h 1m", want: delayd.Ladder{time.Hour, time.Minute}},                                     // need not increase
		{text: "1m30s 1.5s 1d", want: delayd.Ladder{90 * time.Second, 1500 * time.Millisecond, 24 * time.Hour}},
		{text: "", wantErr: delayd.ErrInvalidLadder, errText: "no rungs"},
		{text: "   ", wantErr: delayd.ErrInvalidLadder, errText: "no rungs"},
		{text: "1m 0 5m", wantErr: delayd.ErrInvalidLadder, errText: "rung 2 is 0s"},
		{text: "-1m", wantErr: delayd.ErrInvalidLadder, errText: "rung 1 is -1m0s"},
		{text: "1m soon", wantErr: levels.ErrBadDuration, errText: "rung 2"},
		{text: "5", wantErr: delayd.ErrInvalidLadder, errText: "missing unit"},
		{text: "10us", wantErr: delayd.ErrInvalidLadder, errText: "unknown unit"},
		{text: strings.Repeat("1s ", delayd.LadderMaxRungs+1), wantErr: delayd.ErrInvalidLadder, errText: "at most 64"},
	}
	for _, tt := range tests {
		got, err := delayd.ParseLadder(tt.text)
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) || !errors.Is(err, delayd.ErrInvalidLadder) || !strings.Contains(err.Error(), tt.errText) {
				t.Errorf("ParseLadder(%q) = %v, %v; want an error wrapping %v containing %q", tt.text, got, err, tt.wantErr, tt.errText)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseLadder(%q) = %v, %v; want %v", tt.text, got, err, tt.want)
		}
		if again, err := delayd.ParseLadder(got.String()); err != nil || !slices.Equal(again, got) {
			t.Errorf("ParseLadder(%q.String() = %q) = %v, %v; want it back", tt.text, got.String(), again, err)
		}
	}
}

func TestRetryRecord(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	r := delayd.RetryRecord{Attempt: 2, At: at, Delay: 90 * time.Second, Cause: `gateway said "no"; try later`}
	s := r.String()
	if want := `attempt=2 at=2026-11-30T10:00:00.123456789Z delay=1m30s cause="gateway said \"no\"; try later"`; s != want {
		t.Errorf("String() = %s, want %s", s, want)
	}
	got, err := delayd.ParseRetryRecord(s)
	if err != nil || got != r {
		t.Errorf("ParseRetryRecord(%s) = %+v, %v; want %+v", s, got, err, r)
	}
	for _, bad := range []string{"", "attempt=1", "attempt=x at=2026-11-30T10:00:00Z delay=1s cause=\"\"", "attempt=1 at=now delay=1s cause=\"\"", "attempt=1 at=2026-11-30T10:00:00Z delay=1s cause=unquoted"} {
		if _, err := delayd.ParseRetryRecord(bad); !errors.Is(err, delayd.ErrInvalidRetry) {
			t.Errorf("ParseRetryRecord(%q): %v, want ErrInvalidRetry", bad, err)
		}
	}
}

// retryBundle is a server with delayd's ingress and dead-letter streams as
// delayd creates them, but no delayd: what Retry publishes stays there for
// inspection.
type retryBundle struct {
	js      jetstream.JetStream
	ingress jetstream.Stream
	dlq     jetstream.Stream
}

func setupRetry(t *testing.T) *retryBundle {
	t.Helper()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	ingress, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deliver.IngressStream, Subjects: []string{"delay.>"}, Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deliver.DLQStream, Subjects: []string{contract.DLQSubjectPrefix + ">"}, Duplicates: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &retryBundle{js: js, ingress: ingress, dlq: dlq}
}

// delivered is a message as delayd delivers it to orders.close.
func delivered(id string, extra nats.Header) *nats.Msg {
	m := nats.NewMsg("orders.close")
	m.Data = []byte("close order 42")
	m.Header.Set(contract.HeaderNatsMsgID, id)
	m.Header.Set(delayd.HeaderEnqueuedAt, "2026-11-30T10:00:00.000000000Z")
	m.Header.Set(delayd.HeaderDueAt, "2026-11-30T10:01:00.000000000Z")
	m.Header.Set(delayd.HeaderHops, "1")
	m.Header["X-Trace"] = []string{"a", "b"}
	for k, v := range extra {
		m.Header[k] = v
	}
	return m
}

func TestRetryMsg(t *testing.T) {
	t.Parallel()
	b := setupRetry(t)
	ctx := context.Background()
	ladder := delayd.MustParseLadder("1m 5m")

	// The first failure: attempt 1, the first rung.
	res, err := delayd.RetryMsg(ctx, b.js, delivered("order-42", nats.Header{"Nats-Expected-Stream": {"X"}, "Delayd-Origin": {"forged"}}), ladder, errors.New("gateway\ndown"))
	if err != nil {
		t.Fatal(err)
	}
	want := delayd.RetryResult{Attempt: 1, Delay: time.Minute, Subject: "delay.orders.close", MsgID: "order-42-retry1", Sequence: 1}
	if res != want {
		t.Errorf("first retry: %+v, want %+v", res, want)
	}
	m, err := b.ingress.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "delay.orders.close" || string(m.Data) != "close order 42" {
		t.Errorf("stored %s %q", m.Subject, m.Data)
	}
	for k, v := range map[string]string{delayd.HeaderDuration: "1m0s", delayd.HeaderAttempt: "1", "Nats-Msg-Id": "order-42-retry1"} {
		if got := m.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for _, k := range []string{delayd.HeaderEnqueuedAt, delayd.HeaderDueAt, delayd.HeaderHops, "Nats-Expected-Stream", "Delayd-Origin"} {
		if v := m.Header.Values(k); len(v) > 0 {
			t.Errorf("%s = %q reached ingress, want it removed", k, v)
		}
	}
	if v := m.Header.Values("X-Trace"); !slices.Equal(v, []string{"a", "b"}) {
		t.Errorf("X-Trace = %q, want [a b]", v)
	}
	hist, err := delayd.RetryHistory(m.Header)
	if err != nil || len(hist) != 1 || hist[0].Attempt != 1 || hist[0].Delay != time.Minute || hist[0].Cause != "gateway down" || time.Since(hist[0].At) > time.Minute {
		t.Errorf("history %+v, %v; want one record: attempt 1, 1m, \"gateway down\", now", hist, err)
	}

	// A consumer that crashed before acking retries the same delivery
	// again: deduped at ingress.
	res, err = delayd.RetryMsg(ctx, b.js, delivered("order-42", nil), ladder, errors.New("gateway down"))
	if err != nil || !res.Duplicate || res.Sequence != 1 {
		t.Errorf("second call for attempt 1: %+v, %v; want a duplicate of sequence 1", res, err)
	}

	// Its delivery fails: attempt 2, the second rung, history appended, id
	// from the first id (not "order-42-retry1-retry2").
	d := delivered("order-42-retry1", nats.Header{delayd.HeaderAttempt: {"1"}, delayd.HeaderRetryHistory: m.Header.Values(delayd.HeaderRetryHistory)})
	res, err = delayd.RetryMsg(ctx, b.js, d, ladder, errors.New("still down"))
	if err != nil || res.Attempt != 2 || res.Delay != 5*time.Minute || res.MsgID != "order-42-retry2" || res.DeadLettered {
		t.Fatalf("second retry: %+v, %v", res, err)
	}
	m, _ = b.ingress.GetMsg(ctx, res.Sequence)
	hist, _ = delayd.RetryHistory(m.Header)
	if len(hist) != 2 || hist[1].Attempt != 2 || hist[1].Cause != "still down" || m.Header.Get(delayd.HeaderAttempt) != "2" || m.Header.Get(delayd.HeaderDuration) != "5m0s" {
		t.Errorf("second retry stored %v", m.Header)
	}

	// Its delivery fails too: the ladder is exhausted, a dead letter.
	d = delivered("order-42-retry2", nats.Header{"delay-attempt": {" 2 "}, delayd.HeaderRetryHistory: m.Header.Values(delayd.HeaderRetryHistory)})
	res, err = delayd.RetryMsg(ctx, b.js, d, ladder, errors.New(strings.Repeat("x", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	want = delayd.RetryResult{DeadLettered: true, Attempt: 2, Subject: "delayd.dlq.retries", MsgID: "order-42-retries-exhausted", Sequence: 1}
	if res != want {
		t.Errorf("dead letter: %+v, want %+v", res, want)
	}
	if n := ingressCount(t, b.ingress); n != 2 {
		t.Errorf("ingress holds %d messages, want the 2 retries", n)
	}
	dl, err := b.dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	wantErr := "retries exhausted after 3 failed deliveries (the first and 2 retries, ladder 1m 5m): " + strings.Repeat("x", delayd.RetryCauseMax-3) + "..."
	if dl.Subject != "delayd.dlq.retries" || string(dl.Data) != "close order 42" ||
		dl.Header.Get(delayd.HeaderError) != wantErr ||
		dl.Header.Get(delayd.HeaderSubject) != "delay.orders.close" ||
		dl.Header.Get(delayd.HeaderMsgID) != "order-42-retry2" ||
		dl.Header.Get("Nats-Msg-Id") != "order-42-retries-exhausted" {
		t.Errorf("dead letter %s %q %v", dl.Subject, dl.Data, dl.Header)
	}
	if hist, err := delayd.RetryHistory(dl.Header); err != nil || len(hist) != 2 {
		t.Errorf("dead letter history %+v, %v; want 2 records", hist, err)
	}
	res, err = delayd.RetryMsg(ctx, b.js, d, ladder, errors.New("again"))
	if err != nil || !res.Duplicate {
		t.Errorf("dead-lettering twice: %+v, %v; want a duplicate", res, err)
	}

	// With another prefix, and with nil cause.
	b2, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER_INGRESS", Subjects: []string{"later.>"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err = delayd.RetryMsg(ctx, b.js, delivered("p", nil), ladder, nil, delayd.WithRetryPrefix("later"))
	if err != nil || res.Subject != "later.orders.close" {
		t.Fatalf("WithRetryPrefix: %+v, %v", res, err)
	}
	m, _ = b2.GetMsg(ctx, 1)
	if hist, _ := delayd.RetryHistory(m.Header); len(hist) != 1 || hist[0].Cause != "(no cause given)" {
		t.Errorf("nil cause: history %+v", hist)
	}
}

// TestRetryExhaustedText: the dead letter's Delay-Error counts failures as
// users do: a ladder of n rungs dead-letters after n+1 failed deliveries,
// the first and n retries.
func TestRetryExhaustedText(t *testing.T) {
	t.Parallel()
	b := setupRetry(t)
	ctx := context.Background()
	for i, tt := range []struct {
		ladder string
		want   string
	}{
		{"1m", "retries exhausted after 2 failed deliveries (the first and 1 retry, ladder 1m): gateway down"},
		{"1m 5m 10m", "retries exhausted after 4 failed deliveries (the first and 3 retries, ladder 1m 5m 10m): gateway down"},
	} {
		ladder := delayd.MustParseLadder(tt.ladder)
		id := "order-" + strconv.Itoa(i)
		d := delivered(id+"-retry"+strconv.Itoa(len(ladder)), nats.Header{delayd.HeaderAttempt: {strconv.Itoa(len(ladder))}})
		res, err := delayd.RetryMsg(ctx, b.js, d, ladder, errors.New("gateway down"))
		if err != nil || !res.DeadLettered {
			t.Fatalf("ladder %s, attempt %d: %+v, %v; want dead-lettered", ladder, len(ladder), res, err)
		}
		dl, err := b.dlq.GetMsg(ctx, res.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if got := dl.Header.Get(delayd.HeaderError); got != tt.want {
			t.Errorf("ladder %s: Delay-Error %q, want %q", ladder, got, tt.want)
		}
	}
}

func ingressCount(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestRetryInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ladder := delayd.Ladder{time.Second}
	noSubject := delivered("x", nil)
	noSubject.Subject = ""
	tests := []struct {
		name    string
		msg     *nats.Msg
		ladder  delayd.Ladder
		opts    []delayd.RetryOpt
		wantErr error
	}{
		{"nil message", nil, ladder, nil, delayd.ErrInvalidRetry},
		{"no subject", noSubject, ladder, nil, delayd.ErrInvalidRetry},
		{"empty ladder", delivered("x", nil), nil, nil, delayd.ErrInvalidLadder},
		{"zero rung", delivered("x", nil), delayd.Ladder{time.Second, 0}, nil, delayd.ErrInvalidLadder},
		{"bad attempt", delivered("x", nats.Header{delayd.HeaderAttempt: {"two"}}), ladder, nil, delayd.ErrInvalidRetry},
		{"negative attempt", delivered("x", nats.Header{delayd.HeaderAttempt: {"-1"}}), ladder, nil, delayd.ErrInvalidRetry},
		{"two attempts", delivered("x", nats.Header{delayd.HeaderAttempt: {"1"}, "delay-attempt": {"2"}}), ladder, nil, delayd.ErrInvalidRetry},
		{"empty prefix", delivered("x", nil), ladder, []delayd.RetryOpt{delayd.WithRetryPrefix("")}, delayd.ErrInvalidRetry},
		{"forbidden subject", &nats.Msg{Subject: "$JS.API.STREAM.DELETE.X"}, ladder, nil, contract.ErrForbiddenTarget},
		{"subject under the prefix", &nats.Msg{Subject: "delay.orders"}, ladder, nil, contract.ErrForbiddenTarget},
		{"wildcard subject", &nats.Msg{Subject: "orders.*"}, ladder, nil, contract.ErrInvalidTarget},
	}
	for _, tt := range tests {
		// A nil JetStream: validation fails before any I/O.
		if _, err := delayd.RetryMsg(ctx, nil, tt.msg, tt.ladder, errors.New("boom"), tt.opts...); !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.wantErr)
		}
	}
	if _, err := delayd.Retry(ctx, nil, nil, ladder, nil); !errors.Is(err, delayd.ErrInvalidRetry) {
		t.Errorf("Retry(nil msg): %v, want ErrInvalidRetry", err)
	}
}

// TestRetryFallbackID retries a message published straight to a stream
// without a Nats-Msg-Id: the retry's id comes from its stream and sequence.
func TestRetryFallbackID(t *testing.T) {
	t.Parallel()
	b := setupRetry(t)
	ctx := context.Background()
	work, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, "work.x", []byte("w")); err != nil {
		t.Fatal(err)
	}
	cons, err := work.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	res, err := delayd.Retry(ctx, b.js, msg, delayd.Ladder{time.Second}, errors.New("no"))
	if err != nil || res.MsgID != "WORK-1-retry1" || res.Subject != "delay.work.x" {
		t.Errorf("Retry: %+v, %v; want MsgID WORK-1-retry1 to delay.work.x", res, err)
	}

	// A core message without an id: retried, not deduped.
	res, err = delayd.RetryMsg(ctx, b.js, &nats.Msg{Subject: "work.y", Data: []byte("y")}, delayd.Ladder{time.Second}, nil)
	if err != nil || res.MsgID != "" || res.Attempt != 1 {
		t.Errorf("RetryMsg without an id: %+v, %v; want attempt 1 without a MsgID", res, err)
	}
}
