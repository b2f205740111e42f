package deliver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/levels"
)

// The reschedule tests' target is a core subject ("rtg.>", no stream):
// every delivery is seen, a second one of the same id too (a stream target
// would drop it as a duplicate within its window).

// delivery is one delivery a core subscriber received.
type delivery struct {
	payload string
	h       nats.Header
	at      time.Time // when it was received
}

// catcher records every delivery to rtg.> in order.
type catcher struct {
	mu  sync.Mutex
	all []delivery
}

// catch subscribes to rtg.> on the test's connection.
func (b *ownerBundle) catch() *catcher {
	b.t.Helper()
	c := &catcher{}
	sub, err := b.nc.Subscribe("rtg.>", func(m *nats.Msg) {
		c.mu.Lock()
		c.all = append(c.all, delivery{payload: string(m.Data), h: m.Header, at: time.Now()})
		c.mu.Unlock()
	})
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

// of returns the deliveries of payload, in order.
func (c *catcher) of(payload string) []delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []delivery
	for _, g := range c.all {
		if g.payload == payload {
			out = append(out, g)
		}
	}
	return out
}

// wait waits until every one of payloads was delivered at least once.
func (c *catcher) wait(t *testing.T, within time.Duration, payloads ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var missing []string
		for _, p := range payloads {
			if len(c.of(p)) == 0 {
				missing = append(missing, p)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered within %s: %d of %d (first %q)", within, len(missing), len(payloads), missing[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dueOf is a delivery's Delay-Due-At.
func dueOf(t *testing.T, g delivery) time.Time {
	t.Helper()
	due, err := time.Parse(time.RFC3339Nano, g.h.Get(contract.HeaderDueAt))
	if err != nil {
		t.Fatalf("delivery %q: Delay-Due-At %q: %v", g.payload, g.h.Get(contract.HeaderDueAt), err)
	}
	return due
}

// reschedule asks the reschedule API (scoped to target) to move id with
// the delay header h, and returns the answer's code, body and new due.
func (b *ownerBundle) reschedule(target, id string, h nats.Header) (code int, body string, due time.Time) {
	b.t.Helper()
	m, err := b.nc.RequestMsg(&nats.Msg{Subject: contract.RescheduleSubjectFor(target), Data: []byte(id), Header: h}, time.Minute)
	if err != nil {
		b.t.Fatalf("reschedule %s: %v", id, err)
	}
	code, _ = strconv.Atoi(m.Header.Get(contract.HeaderStatus))
	if s := m.Header.Get(contract.HeaderDueAt); s != "" {
		if due, err = time.Parse(time.RFC3339Nano, s); err != nil {
			b.t.Fatalf("reschedule %s: Delay-Due-At %q: %v", id, s, err)
		}
	}
	return code, string(m.Data), due
}

// mustReschedule is reschedule that must answer "rescheduled".
func (b *ownerBundle) mustReschedule(target, id string, h nats.Header) time.Time {
	b.t.Helper()
	code, body, due := b.reschedule(target, id, h)
	if code != contract.RescheduleStatusRescheduled || body != contract.RescheduleReplyRescheduled || due.IsZero() {
		b.t.Fatalf("reschedule %s: %d %q (due %v), want %d %q with a due", id, code, body, due, contract.RescheduleStatusRescheduled, contract.RescheduleReplyRescheduled)
	}
	return due
}

// in is a Delay-Duration header.
func in(d string) nats.Header { return nats.Header{contract.HeaderDuration: {d}} }

// withID is h with a Nats-Msg-Id.
func withID(h nats.Header, id string) nats.Header {
	h[contract.HeaderNatsMsgID] = []string{id}
	return h
}

// rescheduleLevels is the reschedule tests' table: short levels.
const rescheduleLevels = "1s 5s"

// TestRescheduleKeeps: a rescheduled message keeps its id, payload, user
// headers (two values of one key in order, and another key) and
// Delay-Enqueued-At (as the list showed it before the move); its
// Delay-Due-At is the new due, and it is delivered once, at or after it.
// The list shows it once, with the new due, while it waits.
func TestRescheduleKeeps(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(rescheduleLevels)})
	c := b.catch()
	h := withID(in("2s"), "keep-1")
	h["X-Two"] = []string{"first", "second"}
	h["X-One"] = []string{"1"}
	b.publishTo("rtg.keep", "keep payload", h)
	b.waitRouted()
	before := b.list("rtg.keep", contract.PendingRequest{})
	if len(before.Items) != 1 || before.Items[0].ID != "keep-1" {
		t.Fatalf("list before the move: %+v, want keep-1", before.Items)
	}
	due := b.mustReschedule("rtg.keep", "keep-1", in("4s"))
	after := b.list("rtg.keep", contract.PendingRequest{})
	if len(after.Items) != 1 || after.Items[0].ID != "keep-1" || !after.Items[0].Due.Equal(due) {
		t.Errorf("list after the move: %+v, want keep-1 once, due %s", after.Items, contract.FormatTime(due))
	}
	c.wait(t, time.Minute, "keep payload")
	ds := c.of("keep payload")
	if len(ds) != 1 {
		t.Fatalf("delivered %d times, want once", len(ds))
	}
	d := ds[0]
	for _, check := range []struct {
		name      string
		got, want []string
	}{
		{contract.HeaderNatsMsgID, d.h.Values(contract.HeaderNatsMsgID), []string{"keep-1"}},
		{"X-Two", d.h["X-Two"], []string{"first", "second"}},
		{"X-One", d.h["X-One"], []string{"1"}},
		{contract.HeaderEnqueuedAt, d.h.Values(contract.HeaderEnqueuedAt), []string{contract.FormatTime(before.Items[0].Enqueued)}},
		{contract.HeaderDueAt, d.h.Values(contract.HeaderDueAt), []string{contract.FormatTime(due)}},
	} {
		if !slices.Equal(check.got, check.want) {
			t.Errorf("delivery's %s: %q, want %q", check.name, check.got, check.want)
		}
	}
	if d.at.Before(due) {
		t.Errorf("delivered at %s, before its new due %s", d.at, due)
	}
}

// TestRescheduleRunNow: "Delay-Duration: 0s", and a Delay-Deliver-At in
// the past, deliver a message due in an hour at once (the answer's due is
// the request's time), once; nothing of the target is pending after.
func TestRescheduleRunNow(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse("1s 1h")})
	c := b.catch()
	b.publishTo("rtg.now", "now-0", withID(in("1h"), "now-0"))
	b.publishTo("rtg.now", "now-1", withID(nats.Header{contract.HeaderLevel: {"2"}}, "now-1"))
	b.waitRouted()
	dues := []time.Time{
		b.mustReschedule("rtg.now", "now-0", in("0s")),
		b.mustReschedule("rtg.now", "now-1", nats.Header{contract.HeaderDeliverAt: {"2000-01-01T00:00:00Z"}}),
	}
	c.wait(t, time.Minute, "now-0", "now-1")
	for i, due := range dues {
		p := fmt.Sprintf("now-%d", i)
		ds := c.of(p)
		if len(ds) != 1 || !dueOf(t, ds[0]).Equal(due) {
			t.Errorf("%s: %d deliveries, want one with Delay-Due-At %s (the run-now due answered)", p, len(ds), contract.FormatTime(due))
		}
	}
	b.waitRouted()
	if r := b.list("rtg.now", contract.PendingRequest{}); len(r.Items) != 0 {
		t.Errorf("pending after the run-now deliveries: %+v, want none (the old places are moved)", r.Items)
	}
}

// TestRescheduleThenCancel: a message rescheduled and then cancelled is
// never delivered, while a marker due after all their dues is: rc-0's
// cancel is sent after its move (it finds the new place); rc-1's looks the
// id up before the move and is held there (the Service's looked hook)
// until the move is done, so the owner decides it on the old place, which
// answers "look again", and the cancel follows the move; ten more are
// cancelled while their reschedules are in flight (sent together). Every
// cancel answers "cancelled".
func TestRescheduleThenCancel(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	looked := make(chan index.Record, 1)
	release := make(chan struct{})
	var holding atomic.Bool
	b.startConfig("A", Config{Levels: levels.MustParse(rescheduleLevels)}, func(s *Service) {
		s.hooks.looked = func(rec index.Record) {
			if rec.Key == index.UserKey("rc-1") && holding.CompareAndSwap(false, true) {
				looked <- rec
				<-release
			}
		}
	})
	c := b.catch()
	var ids []string
	for i := range 12 {
		ids = append(ids, fmt.Sprintf("rc-%d", i))
	}
	for _, id := range ids {
		b.publishTo("rtg.rc", id, withID(in("3s"), id))
	}
	b.waitRouted()
	cancelOf := func(id string) string {
		m, err := b.nc.Request(contract.CancelSubjectFor("rtg.rc"), []byte(id), time.Minute)
		if err != nil {
			return err.Error()
		}
		return string(m.Data)
	}
	b.mustReschedule("rtg.rc", "rc-0", in("3s"))
	if got := cancelOf("rc-0"); got != contract.CancelReplyCancelled {
		t.Errorf("cancel after the move: %q, want %q", got, contract.CancelReplyCancelled)
	}
	held := make(chan string, 1)
	go func() { held <- cancelOf("rc-1") }()
	select {
	case <-looked:
	case <-time.After(30 * time.Second):
		t.Fatal("rc-1's cancel did not look the id up within 30 s")
	}
	b.mustReschedule("rtg.rc", "rc-1", in("3s"))
	close(release)
	if got := <-held; got != contract.CancelReplyCancelled {
		t.Errorf("cancel of rc-1 decided on its old place after the move: %q, want %q", got, contract.CancelReplyCancelled)
	}
	var wg sync.WaitGroup
	for _, id := range ids[2:] {
		wg.Go(func() { b.reschedule("rtg.rc", id, in("3s")) })
		wg.Go(func() {
			if got := cancelOf(id); got != contract.CancelReplyCancelled {
				t.Errorf("cancel of %s with its reschedule in flight: %q, want %q", id, got, contract.CancelReplyCancelled)
			}
		})
	}
	wg.Wait()
	b.publishTo("rtg.rc", "marker", in("8s"))
	c.wait(t, time.Minute, "marker")
	for _, id := range ids {
		if ds := c.of(id); len(ds) != 0 {
			t.Errorf("%s, rescheduled and cancelled, was delivered %d times", id, len(ds))
		}
	}
}

// TestRescheduleTwice: a second reschedule moves the first's new message:
// one delivery, with the second's due, at or after it.
func TestRescheduleTwice(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(rescheduleLevels)})
	c := b.catch()
	b.publishTo("rtg.tw", "tw-0", withID(in("2s"), "tw-0"))
	b.waitRouted()
	first := b.mustReschedule("rtg.tw", "tw-0", in("3s"))
	second := b.mustReschedule("rtg.tw", "tw-0", in("5s"))
	if !second.After(first) {
		t.Fatalf("second due %s not after the first %s", second, first)
	}
	c.wait(t, time.Minute, "tw-0")
	b.publishTo("rtg.tw", "marker", in("2s")) // after the second due
	c.wait(t, time.Minute, "marker")
	ds := c.of("tw-0")
	if len(ds) != 1 || !dueOf(t, ds[0]).Equal(second) || ds[0].at.Before(second) {
		t.Errorf("tw-0: %d deliveries (%+v), want one with the second due %s, at or after it", len(ds), ds, contract.FormatTime(second))
	}
}

// TestRescheduleDecidedByOwner: with every level owned by replica A,
// reschedules taken by replica B (which owns no level) are decided and
// moved by A through the level's decide subject (op "reschedule"): each
// answers "rescheduled", and each message is delivered once, with its new
// due, at or after it.
func TestRescheduleDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	_, c := b.splitOwners()
	rx := b.catch()
	for i := range 3 {
		p := fmt.Sprintf("ro-%d", i)
		b.publishTo("rtg.ro", p, withID(in("3s"), p))
	}
	b.waitRouted()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	dues := make([]time.Time, 3)
	for i := range dues { // B's own path: never A's scanner
		p := fmt.Sprintf("ro-%d", i)
		answer, due, err := c.svc.parts.cancelAPI.Reschedule(ctx, reader, p, in("5s"), "rtg.ro", time.Time{})
		if err != nil || answer != level.AnswerRescheduled {
			t.Fatalf("reschedule %s through B (no level owned): %v, %v; want rescheduled", p, answer, err)
		}
		dues[i] = due
	}
	rx.wait(t, time.Minute, "ro-0", "ro-1", "ro-2")
	for i, due := range dues {
		p := fmt.Sprintf("ro-%d", i)
		ds := rx.of(p)
		if len(ds) != 1 || !dueOf(t, ds[0]).Equal(due) || ds[0].at.Before(due) {
			t.Errorf("%s: %d deliveries, want one with Delay-Due-At %s, at or after it", p, len(ds), contract.FormatTime(due))
		}
	}
}

// TestRescheduleRacesDue: 300 messages due 20 ms apart, each rescheduled
// 2 s on at its due instant, give or take up to 50 ms (spread on
// purpose), so that the owner decides some before it hands the message
// off and some after. Every "rescheduled" answer means one delivery, with
// the answered due, at or after it (never the old one as well); every
// "already delivered" one delivery at the old due; any other answer (busy,
// an error) one delivery at either. Nothing is delivered twice or early.
// Both answers must occur (about half each): a run without one did not
// race the two.
func TestRescheduleRacesDue(t *testing.T) {
	t.Parallel()
	const n = 300
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(rescheduleLevels)})
	c := b.catch()
	start := time.Now().Add(5 * time.Second).Truncate(time.Millisecond)
	oldDue := make([]time.Time, n)
	for i := range n {
		oldDue[i] = start.Add(time.Duration(i) * 20 * time.Millisecond)
		p := fmt.Sprintf("race-%d", i)
		b.publishTo("rtg.race", p, withID(nats.Header{contract.HeaderDeliverAt: {contract.FormatTime(oldDue[i])}}, p))
	}
	type answer struct {
		code int
		body string
		due  time.Time
		err  error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			off := time.Duration((i*37)%101-50) * time.Millisecond
			time.Sleep(time.Until(oldDue[i].Add(off)))
			m, err := b.nc.RequestMsg(&nats.Msg{Subject: contract.RescheduleSubjectFor("rtg.race"), Data: []byte(fmt.Sprintf("race-%d", i)), Header: in("2s")}, 2*time.Minute)
			if err != nil {
				answers[i].err = err
				return
			}
			answers[i].code, _ = strconv.Atoi(m.Header.Get(contract.HeaderStatus))
			answers[i].body = string(m.Data)
			if s := m.Header.Get(contract.HeaderDueAt); s != "" {
				answers[i].due, answers[i].err = time.Parse(time.RFC3339Nano, s)
			}
		})
	}
	wg.Wait()
	last := start
	payloads := make([]string, n)
	for i, a := range answers {
		payloads[i] = fmt.Sprintf("race-%d", i)
		if a.due.After(last) {
			last = a.due
		}
	}
	c.wait(t, 2*time.Minute, payloads...)
	// A marker due after every new due: once it is delivered, so is
	// anything still to come (a liveness bound, not a property).
	b.publishTo("rtg.race", "marker", nats.Header{contract.HeaderDeliverAt: {contract.FormatTime(last.Add(time.Second))}})
	c.wait(t, 2*time.Minute, "marker")
	counts := map[string]int{}
	for i, a := range answers {
		p := payloads[i]
		ds := c.of(p)
		for _, d := range ds {
			if due := dueOf(t, d); d.at.Before(due) {
				t.Errorf("%s delivered at %s, before its Delay-Due-At %s", p, d.at, due)
			}
		}
		if len(ds) != 1 {
			t.Errorf("%s (answer %d %q, %v): delivered %d times, want once", p, a.code, a.body, a.err, len(ds))
			continue
		}
		switch due := dueOf(t, ds[0]); {
		case a.err != nil:
			counts["no answer"]++
		case a.code == contract.RescheduleStatusRescheduled:
			counts["rescheduled"]++
			if !due.Equal(a.due) {
				t.Errorf("%s rescheduled to %s: delivered with Delay-Due-At %s (old %s)", p, contract.FormatTime(a.due), contract.FormatTime(due), contract.FormatTime(oldDue[i]))
			}
		case a.code == contract.CancelStatusDelivered:
			counts["already delivered"]++
			if !due.Equal(oldDue[i]) {
				t.Errorf("%s answered already delivered: delivered with Delay-Due-At %s, want its old due %s", p, contract.FormatTime(due), contract.FormatTime(oldDue[i]))
			}
		case a.code == contract.CancelStatusNotFound:
			t.Errorf("%s answered not found", p)
		default:
			counts[fmt.Sprintf("%d %s", a.code, a.body)]++
		}
	}
	t.Logf("answers: %v", counts)
	if counts["rescheduled"] == 0 || counts["already delivered"] == 0 {
		t.Errorf("answers %v: want some rescheduled and some already delivered, or this run did not race the moves with the deliveries", counts)
	}
}

// TestRescheduleMergedGroup: a merged group moves as one
// (docs/pending.md#26-merge-keys-run-now-reschedule-then-cancel). A and
// B share a merge key (B merged into A), due in 20 s; A is rescheduled
// to 3 s from now; C with the key, published after the move, is merged
// into A at its new place; A's payload is delivered once, at its new due.
// D with the key, published once A was delivered (its old place still
// ahead, held as moved), is delivered on its own: the key follows A to
// its new place, which was delivered. B, merged, cannot be rescheduled
// (not found).
func TestRescheduleMergedGroup(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(rescheduleLevels)})
	c := b.catch()
	merged := func(h nats.Header) nats.Header {
		h[contract.HeaderMergeKey] = []string{"group"}
		return h
	}
	b.publishTo("rtg.mg", "A", merged(withID(in("20s"), "mg-a")))
	b.publishTo("rtg.mg", "B", merged(withID(in("20s"), "mg-b")))
	b.waitRouted()
	due := b.mustReschedule("rtg.mg", "mg-a", in("3s"))
	if code, body, _ := b.reschedule("rtg.mg", "mg-b", in("4s")); code != contract.CancelStatusNotFound {
		t.Errorf("reschedule of B, merged into A: %d %q, want 404 %q", code, body, contract.CancelReplyNotFound)
	}
	b.publishTo("rtg.mg", "C", merged(in("1s")))
	c.wait(t, time.Minute, "A")
	b.publishTo("rtg.mg", "D", merged(in("1s")))
	c.wait(t, time.Minute, "D")
	if ds := c.of("A"); len(ds) != 1 || !dueOf(t, ds[0]).Equal(due) || ds[0].at.Before(due) {
		t.Errorf("A: %d deliveries (%+v), want one with its new due %s, at or after it", len(ds), ds, contract.FormatTime(due))
	}
	for _, p := range []string{"B", "C"} {
		if ds := c.of(p); len(ds) != 0 {
			t.Errorf("%s, merged into A, was delivered %d times", p, len(ds))
		}
	}
	if ds := c.of("D"); len(ds) != 1 {
		t.Errorf("D, published after A's delivery: %d deliveries, want one", len(ds))
	}
}
