package hedge_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/internal/natstest"
)

// swallowFirst answers every request on subject but the first (a replica
// that hangs) with its number, from 2.
func swallowFirst(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	n := 0
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		n++ // the subscription's one goroutine
		if n > 1 {
			_ = m.Respond([]byte{byte('0' + n)})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// TestDoResendsUnanswered: a request whose first try is never answered is
// answered by the second, within the caller's deadline.
func TestDoResendsUnanswered(t *testing.T) {
	t.Parallel()
	nc, _ := natstest.Connect(t)
	swallowFirst(t, nc, "read")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := hedge.Do(ctx, 200*time.Millisecond, func(ctx context.Context) (*nats.Msg, error) {
		return nc.RequestWithContext(ctx, "read", nil)
	})
	if err != nil {
		t.Fatalf("hedged request: %v", err)
	}
	if string(m.Data) != "2" {
		t.Fatalf("answer %q, want the second try's", m.Data)
	}
}

// TestDoAnswerIsError: an error that is an answer ends the read at once,
// without another try; the caller's deadline ends one never answered.
func TestDoAnswerIsError(t *testing.T) {
	t.Parallel()
	errNo := errors.New("no such key")
	tries := 0
	_, err := hedge.Do(context.Background(), time.Hour, func(context.Context) (int, error) { tries++; return 0, errNo })
	if !errors.Is(err, errNo) || tries != 1 {
		t.Fatalf("error %v after %d tries, want %v after 1", err, tries, errNo)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = hedge.Do(ctx, 50*time.Millisecond, func(ctx context.Context) (int, error) { <-ctx.Done(); return 0, ctx.Err() })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("never answered: %v, want the deadline", err)
	}
}

// TestKVGet: a KV bucket's Get through hedge.KV reads the key (a direct
// get, as any replica may answer) and reports a missing key as such.
func TestKVGet(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "HEDGE"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	h := hedge.KV(kv)
	if e, err := h.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
		t.Fatalf("get k: %v", err)
	}
	if _, err := h.Get(ctx, "missing"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("get missing: %v, want ErrKeyNotFound", err)
	}
}
