package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/levels"
)

// lockedBuffer is a bytes.Buffer a logger writes from any goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRouterIngressAnswersLost: the first answer to each of the router's
// requests about its ingress consumers at start (the list, the delete of
// an earlier term's consumer, the create of its own) is lost, as when
// JetStream's meta leader hangs after applying it (a test hook drops the
// answer; the request was applied). Each must be sent again and its
// second answer taken, the delete's "not found" as done: the router
// starts once, with no session restart ("router restarting"), deletes the
// earlier term's consumer and routes every message.
func TestRouterIngressAnswersLost(t *testing.T) {
	t.Parallel()
	b := setupServer(t)
	table := levels.MustParse("1m")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, b.nc, table)
	// An earlier term's consumer, which this term's start deletes.
	earlier := RouterConsumerName(1)
	if _, err := b.js.CreateOrUpdateConsumer(ctx, resource.IngressStream, jetstream.ConsumerConfig{
		Durable: earlier, AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var logs lockedBuffer
	r, err := New(mustJS(nc, 0), Config{Prefix: "delay", Levels: table, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[string]int{}
	r.hooks.loseAnswer = func(op string) bool {
		mu.Lock()
		defer mu.Unlock()
		calls[op]++
		return calls[op] == 1
	}

	const n = 20
	for i := range n {
		b.publishTo("tgt.x", fmt.Sprintf("m-%d", i), nats.Header{contract.HeaderLevel: {"1"}})
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.RunTerm(rctx, ownership.Term{Epoch: 2})
	}()
	defer func() { stop(); <-done }()

	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if st := r.Stats(); st.Routed >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the router routed %d of %d; its log:\n%s", r.Stats().Routed, n, logs.String())
		}
	}
	mu.Lock()
	for _, op := range []string{"list", "delete", "create"} {
		if calls[op] < 2 {
			t.Errorf("the %s request was sent %d times, want its first answer lost and a second try: this run does not test it", op, calls[op])
		}
	}
	mu.Unlock()
	if got := strings.Count(logs.String(), "router restarting"); got > 0 {
		t.Errorf("the router restarted its session %d times over lost answers, want none (each request sent again); its log:\n%s", got, logs.String())
	}
	if _, err := b.js.Consumer(ctx, resource.IngressStream, earlier); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the earlier term's consumer %s: %v, want it deleted", earlier, err)
	}
}
