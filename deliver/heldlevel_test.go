package deliver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestRouterStartsPastUnreadableLevel: one level stream's tail cannot be
// read (its reads fail, as when its leader hangs or is being elected;
// here a test hook in the tail sync). The router must still route the
// other level: its messages, published before and after the router
// started, reach their target while the unreadable level's are held.
// Once the level can be read, its held messages and the ones published
// since must all arrive, each once, in publish order.
func TestRouterStartsPastUnreadableLevel(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	table := levels.MustParse("1s 2s")
	held, _ := table.Level(2)
	var blocked atomic.Bool
	var refused atomic.Int64
	blocked.Store(true)
	hook := func(s *Service) {
		s.hooks.tailHook = func(stream string) error {
			if stream == held.Stream() && blocked.Load() {
				refused.Add(1)
				return errors.New("test: tail unreadable")
			}
			return nil
		}
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			b.publishTo("tgt.a", fmt.Sprintf("a-%d", i), nats.Header{contract.HeaderLevel: {"1"}})
			b.publishTo("tgt.b", fmt.Sprintf("b-%d", i), nats.Header{contract.HeaderLevel: {"2"}})
		}
	}
	// byTarget splits TGT's payloads by their prefix, in TGT's order.
	byTarget := func() (a, bs []string) {
		for _, p := range b.targetPayloads() {
			if strings.HasPrefix(p, "a-") {
				a = append(a, p)
			} else {
				bs = append(bs, p)
			}
		}
		return a, bs
	}
	want := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}
	waitA := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			a, bs := byTarget()
			if len(a) >= n {
				if !slices.Equal(a, want("a", n)) {
					t.Fatalf("level 1's target holds %q, want %q", a, want("a", n))
				}
				if len(bs) > 0 {
					t.Fatalf("the unreadable level delivered %q while its tail could not be read", bs)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("40 s after publishing, level 1 delivered %d of %d while level 2's tail was unreadable (%d reads refused): one unreadable level holds the router",
					len(a), n, refused.Load())
			}
		}
	}

	b.launch("a", Config{Levels: table}, hook)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := b.js.Stream(context.Background(), IngressStream); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no %s after 20 s: %v", IngressStream, err)
		}
	}
	publish(0, 10)
	waitA(10)
	publish(10, 20) // while level 2 is held
	waitA(20)
	if refused.Load() == 0 {
		t.Fatal("level 2's tail was never read: the test tested nothing")
	}
	blocked.Store(false)
	publish(20, 25) // after it can be read again
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		a, bs := byTarget()
		if len(a) >= 25 && len(bs) >= 25 {
			if !slices.Equal(a, want("a", 25)) || !slices.Equal(bs, want("b", 25)) {
				t.Fatalf("TGT holds\n%q\n%q\nwant each once, in publish order:\n%q\n%q", a, bs, want("a", 25), want("b", 25))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("40 s after level 2 became readable TGT holds %q and %q, want 25 of each", a, bs)
		}
	}
	time.Sleep(time.Second) // a doubled delivery would land by now
	if a, bs := byTarget(); len(a) != 25 || len(bs) != 25 {
		t.Fatalf("TGT holds %d and %d, want 25 of each once", len(a), len(bs))
	}
}
