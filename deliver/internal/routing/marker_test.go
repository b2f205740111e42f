package routing

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

func TestIsMarker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject string
		want    bool
	}{
		{"delayd.level.5S.delayd.router.epoch", true},
		{markerSubject("1M30S"), true},
		{"delayd.level.5S.orders.close", false},
		{"delayd.level.5S.x.delayd.router.epoch", false}, // a valid target ending like the marker's
		{"delayd.level.5S.delayd.router.epoch.x", false},
		{"delayd.level.5S", false},
		{"delayd.router.epoch", false},
	} {
		if got := message.IsMarker(tc.subject); got != tc.want {
			t.Errorf("isMarker(%q) = %v, want %v", tc.subject, got, tc.want)
		}
	}
	// No publisher's target can be the marker's: it lies under delayd's
	// internal subjects.
	if err := contract.ValidateTarget(markerTarget, contract.PrefixDefault); err == nil {
		t.Errorf("target %q is valid; the marker subject could collide with a publisher's", markerTarget)
	}
}

// heldOwners is a router's view of the level owners ([Owners]) that
// holds the router inside its merge check: Pending reports each call on
// entered and returns false (not merged) once release is closed. A router
// held there has classified a message and checked its term, and is about
// to write it: the moment a stale router can be paused.
type heldOwners struct {
	entered chan index.Record
	release chan struct{}
}

func newHeldOwners() *heldOwners {
	return &heldOwners{entered: make(chan index.Record, 4), release: make(chan struct{})}
}

func (g *heldOwners) Pending(_ context.Context, rec index.Record) bool {
	g.entered <- rec
	<-g.release
	return false
}

func (g *heldOwners) Passed(context.Context, string) uint64 { return 0 }

// TestStaleRouterFenced drives the race of docs/guarantees.md#epoch-markers
// deterministically, with two routers on one server: router A (term 5)
// has classified ingress message m2 and checked its term, and is held just
// before its level write (in its merge check); router B (term 6) takes
// over, writes its epoch markers and takes m2 from its own ingress
// consumer; then A writes m2, expecting the level stream's last sequence as
// A synced it. The write is refused (B's marker moved the tail), A's
// resync finds B's newer epoch, and A stops fenced: it takes nothing for
// stored (skipped stays 0) and routes nothing more. B then writes m2, and
// the level stream holds m1 and m2 once each, in ingress order, between
// the markers. The fence must come from the level-stream path (counted
// under a level stream): the ingress consumer check would stop A as well,
// a session later, and is tested alone by
// [TestStaleRouterFencedMarkersPurged]; with checkMarker a no-op this test
// fails.
func TestStaleRouterFenced(t *testing.T) {
	t.Parallel()
	staleRouterFenced(t, false)
}

// TestStaleRouterFencedMarkersPurged is [TestStaleRouterFenced] once
// router B's epoch markers are gone from every level stream (B wrote m2
// and m3 past its marker in the level, and the scanners purge delivered
// messages; the test deletes them): no marker fences A, yet A stops
// without taking its refused m2 for stored, by the per-term ingress
// consumer (B's, of term 6, exists: resetConsumers) or by the tail check
// after a failed write's resync (m3 past A's m2: checkTails), whichever A
// meets first. (Here A's pull finds its consumer deleted first, so the
// consumer check is what this test exercises.) Either counts the fence
// once in A's FencedWrites.
func TestStaleRouterFencedMarkersPurged(t *testing.T) {
	t.Parallel()
	staleRouterFenced(t, true)
}

// staleRouterFenced runs the race of [TestStaleRouterFenced]; with
// purged, router B writes m2 and m3 and its markers are deleted before A
// is let go.
func staleRouterFenced(t *testing.T, purged bool) {
	srv := natstest.Start(t, nil)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc := connect()
	table := levels.MustParse("1h")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hopSecret := setupStreams(t, ctx, nc, table)
	level, _ := table.Level(1)
	stream := level.Stream()
	newRouterT := func(gate *heldOwners) *Router {
		r, err := New(mustJS(connect(), 0), Config{Prefix: "delay", Levels: table},
			Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopSecret, Owners: gate})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	js, _ := jetstream.New(nc)
	publish := func(i int) {
		t.Helper()
		m := &nats.Msg{Subject: "delay.orders.close", Data: []byte("m" + strconv.Itoa(i)), Header: nats.Header{}}
		m.Header.Set(contract.HeaderLevel, "1")
		if i < 3 { // m3 has no merge key: no merge check holds it
			m.Header.Set(contract.HeaderMergeKey, "order-42")
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// run runs r for a term of epoch; done is closed when it returned,
	// with its error in *err.
	run := func(r *Router, epoch uint64, gate *heldOwners) (done chan struct{}, err *error) {
		rctx, stop := context.WithCancel(ctx)
		done, err = make(chan struct{}), new(error)
		// A Term without a lease is held for ever: as a router paused
		// past its fence would believe.
		go func() { defer close(done); *err = r.RunTerm(rctx, ownership.Term{Epoch: epoch}) }()
		t.Cleanup(func() {
			stop()
			select {
			case <-gate.release:
			default:
				close(gate.release)
			}
			<-done
		})
		return done, err
	}

	gateA, gateB := newHeldOwners(), newHeldOwners()
	a, b := newRouterT(gateA), newRouterT(gateB)
	doneA, errA := run(a, 5, gateA)
	publish(1)
	waitFor("router A to route m1", func() bool { return a.Stats().Routed == 1 })
	publish(2) // same merge key and target: A checks whether m1 is pending
	<-gateA.entered
	t.Log("router A (term 5) holds m2, about to write it")

	doneB, errB := run(b, 6, gateB)
	<-gateB.entered
	t.Log("router B (term 6) wrote its markers and holds m2 from its own consumer")
	if purged {
		close(gateB.release)
		waitFor("router B to route m2", func() bool { return b.Stats().Routed == 1 })
		publish(3)
		waitFor("router B to route m3", func() bool { return b.Stats().Routed == 2 })
		for _, w := range b.writers.all {
			h, seq, _, err := jswire.LastOnSubject(ctx, nc, w.stream, w.marker)
			if e, ok := markerEpoch(h); err != nil || !ok || e != 6 {
				t.Fatalf("%s: newest marker of epoch %d (%v), error %v; want router B's, 6", w.stream, e, ok, err)
			}
			ws, err := js.Stream(ctx, w.stream)
			if err == nil {
				err = ws.DeleteMsg(ctx, seq)
			}
			if err != nil {
				t.Fatalf("delete router B's marker in %s: %v", w.stream, err)
			}
		}
		t.Log("router B wrote m2 and m3; its markers are purged")
	}
	close(gateA.release)

	select {
	case <-doneA:
		if *errA != nil {
			t.Fatalf("router A returned %v", *errA)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("router A (stale) still routes 30 s after B's takeover: %+v", a.Stats())
	}
	st := a.Stats()
	var fenced uint64
	for _, n := range st.FencedWrites {
		fenced += n
	}
	if st.Routed != 1 || st.Skipped != 0 {
		t.Errorf("stale router A: routed %d (want 1: m2's write refused), skipped %d (want 0: its refused write never taken for stored)",
			st.Routed, st.Skipped)
	}
	if !purged && (fenced != 1 || st.FencedWrites[resource.IngressStream] != 0) {
		// The level-stream path alone: A's resync after its refused write
		// reads B's marker in a level stream (checkMarker; the first
		// level stream it syncs, DELAYD_0S). The ingress consumer check
		// would stop A too, a session later, counted under the ingress
		// stream: that defence is TestStaleRouterFencedMarkersPurged's.
		t.Errorf("stale router A: fenced %v, want once, by a level stream's epoch marker (not by %s's consumer check)", st.FencedWrites, resource.IngressStream)
	}
	if purged && (fenced != 1 || fenced != st.FencedWrites[stream]+st.FencedWrites[resource.IngressStream]) {
		// Whichever A meets first: its resync's tail check (m3 past its
		// m2: fenced by the level stream) or, after its pull finds its
		// consumer deleted, the next session's consumer check (B's
		// consumer of term 6 exists: counted under the ingress stream).
		t.Errorf("stale router A: fenced %v, want once, by %s or %s", st.FencedWrites, stream, resource.IngressStream)
	}
	if !purged {
		close(gateB.release)
		waitFor("router B to route m2", func() bool { return b.Stats().Routed == 1 })
	}
	if st := b.Stats(); len(st.FencedWrites) != 0 || st.Skipped != 0 {
		t.Errorf("router B: %+v", st)
	}
	select {
	case <-doneB:
		t.Fatalf("router B stopped: %v", *errB)
	default:
	}

	// The level stream: A's marker, m1, B's marker, m2.
	reader, err := jswire.NewBatchReader(nc, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	msgs, err := reader.Read(ctx, stream, nil, 1, 16, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var ingress []uint64
	for _, m := range msgs {
		if isMarkerMsg(m) {
			got = append(got, "marker "+m.Header.Get(message.HdrRouterEpoch))
			continue
		}
		got = append(got, string(m.Data))
		_, seq, ok := message.ParseIngressRef(m.Header.Get(message.HdrIngress))
		if !ok {
			t.Errorf("level message %q without an ingress reference", m.Data)
		}
		ingress = append(ingress, seq)
	}
	want, newest, newestSeq := []string{"marker 5", "m1", "marker 6", "m2"}, uint64(6), uint64(3)
	if purged {
		want, newest, newestSeq = []string{"marker 5", "m1", "m2", "m3"}, 5, 1
	}
	if !slices.Equal(got, want) {
		t.Errorf("level stream %s holds %v, want %v", stream, got, want)
	}
	if !slices.IsSorted(ingress) || len(slices.Compact(slices.Clone(ingress))) != len(ingress) {
		t.Errorf("level stream %s: ingress sequences %v not strictly increasing", stream, ingress)
	}
	// What a resync reads of the newest marker, from the stream's leader.
	h, seq, _, err := jswire.LastOnSubject(ctx, nc, stream, markerSubject(level.Name()))
	if e, ok := markerEpoch(h); err != nil || !ok || e != newest || seq != newestSeq {
		t.Errorf("newest marker of %s: epoch %d (%v) at sequence %d, error %v; want epoch %d at sequence %d", stream, e, ok, seq, err, newest, newestSeq)
	}
	if h, _, found, err := jswire.LastOnSubject(ctx, nc, stream, "delayd.level.1H.orders.none"); h != nil || found || err != nil {
		t.Errorf("last message on a subject with none: %v, %v; want nil, nil", h, err)
	}
}
