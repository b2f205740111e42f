package integration

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestCancelSlowTombstone: a cancel whose tombstone write gets no answer
// holds no delivery of the other messages of its level. The tombstone
// writes are diverted to a subscriber of the test's (DELAYD_CANCELS stops
// capturing their subjects), which holds the write until the five messages
// published before the cancelled one at the same level have been delivered,
// and only then answers: with the stored tombstone's PubAck ("stored": the
// reply is cancelled, and the message is never delivered) or with an error
// ("refused": the reply is an error, and the message is delivered). Either
// way the cancel's reply must not come before those five deliveries, and
// the message is delivered xor cancelled, as its reply says.
func TestCancelSlowTombstone(t *testing.T) {
	t.Parallel()
	for _, stored := range []bool{true, false} {
		name := map[bool]string{true: "stored", false: "refused"}[stored]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := itest.Setup(t)
			b.StartDelayd("1s 4s")
			c := b.Collect("slow.x")
			ctx, cancelCtx := context.WithTimeout(context.Background(), time.Minute)
			defer cancelCtx()

			tombs, err := b.JS.Stream(ctx, deliver.CancelStream)
			if err != nil {
				t.Fatal(err)
			}
			cfg := tombs.CachedInfo().Config
			original := slices.Clone(cfg.Subjects)
			cfg.Subjects = []string{"test.diverted.>"}
			if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			held := make(chan *nats.Msg, 4)
			sub, err := b.NC.ChanSubscribe("delayd.cancels.>", held)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := b.NC.Flush(); err != nil {
				t.Fatal(err)
			}

			for i := range 5 {
				b.Publish("delay.slow.x", []byte{'a', byte('0' + i)}, itest.Level(2))
			}
			hdr := itest.Level(2)
			hdr.Set("Nats-Msg-Id", "slow-x")
			b.Publish("delay.slow.x", []byte("x"), hdr)

			type answer struct {
				r   delayd.CancelResult
				err error
			}
			replied := make(chan answer, 1)
			go func() {
				r, err := delayd.CancelAny(ctx, b.NC, "slow-x")
				replied <- answer{r, err}
			}()
			var write *nats.Msg
			select {
			case write = <-held:
			case a := <-replied:
				t.Fatalf("cancel answered %q, %v before writing its tombstone", a.r, a.err)
			case <-ctx.Done():
				t.Fatal("no tombstone write")
			}

			// The write is held. The five earlier messages must be
			// delivered meanwhile, and before the cancel is answered.
			for len(c.Snapshot()) < 5 {
				select {
				case <-c.Ch:
				case a := <-replied:
					t.Fatalf("cancel answered %q, %v while the level had delivered %d of the 5 messages before it: the tombstone write held the level",
						a.r, a.err, len(c.Snapshot()))
				case <-ctx.Done():
					t.Fatal("the 5 messages before the cancelled one were not delivered")
				}
			}
			for _, r := range c.Snapshot() {
				if string(r.Msg.Data) == "x" {
					t.Fatal("the message being cancelled was delivered while its tombstone write was held")
				}
			}

			var a answer
			if stored {
				// Store the tombstone where delayd meant to, and answer
				// with its PubAck.
				cfg.Subjects = original
				if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
					t.Fatal(err)
				}
				ack, err := b.NC.RequestMsgWithContext(ctx, &nats.Msg{Subject: write.Subject, Data: write.Data})
				if err != nil {
					t.Fatal(err)
				}
				if err := write.Respond(ack.Data); err != nil {
					t.Fatal(err)
				}
				if a = <-replied; a.err != nil || a.r != delayd.Cancelled {
					t.Fatalf("cancel: %q, %v; want cancelled", a.r, a.err)
				}
				// A message published after the cancel was answered is
				// delivered after the cancelled one was passed.
				b.Publish("delay.slow.x", []byte("z"), itest.Level(2))
				got := c.Wait(t, 6, 30*time.Second)
				for _, r := range got {
					if string(r.Msg.Data) == "x" {
						t.Fatal("cancelled message delivered")
					}
				}
				if string(got[5].Msg.Data) != "z" {
					t.Fatalf("6th delivery %q, want z", got[5].Msg.Data)
				}
			} else {
				if err := write.Respond([]byte(`{"error":{"code":503,"err_code":10077,"description":"test: tombstone refused"}}`)); err != nil {
					t.Fatal(err)
				}
				if a = <-replied; !errors.Is(a.err, delayd.ErrCancelReply) {
					t.Fatalf("cancel: %q, %v; want an error reply", a.r, a.err)
				}
				got := c.Wait(t, 6, 30*time.Second)
				if string(got[5].Msg.Data) != "x" {
					t.Fatalf("6th delivery %q, want x (its cancel failed)", got[5].Msg.Data)
				}
			}
			var n uint64
			_, ss := b.Svc.Stats()
			for _, s := range ss {
				n += s.Cancelled
			}
			if want := map[bool]uint64{true: 1, false: 0}[stored]; n != want {
				t.Errorf("scanners counted %d cancelled, want %d", n, want)
			}
		})
	}
}
