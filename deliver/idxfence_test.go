package deliver

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
)

// TestCancelAfterStaleRouterWrite: router A (term 5) is held with ingress
// message m2 classified, just before its level write (in its merge
// check); router B (term 6) takes over, writes its epoch markers and
// routes m2 (its write and index records stored, m2 acked); then A sends
// its write of m2, which B's marker makes the server refuse, and A stops
// fenced. A's index records of m2 must not land after B's: the records of
// a refused write would place m2 at the sequence B's marker took, and a
// cancel would answer "not found" while m2 is pending. B stops, and a
// Service takes the router lease after B (term 7) and owns the level: a
// cancel of m2 by its id answers "cancelled", and m2 is never delivered,
// while m1 before it and m3 after it are.
func TestCancelAfterStaleRouterWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 10 s level: skipped under testing.Short()")
	}
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	table := levels.MustParse("10s")
	level, _ := table.Level(1)
	stream := level.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := New(b.nc, Config{Levels: table})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := svc.setup(ctx); err != nil {
		t.Fatal(err)
	}
	connect := func() *nats.Conn {
		nc, err := nats.Connect(b.srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	newRouterT := func(gate *heldOwners) *routing.Router {
		r, err := routing.New(mustJS(connect(), 0), RouterConfig{Prefix: "delay", Levels: table}.routing(),
			routing.Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: svc.parts.hopKey, Owners: gate})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	// run runs r for a term of epoch (a Term without a lease: held for
	// ever, as a router paused past its fence believes); stop ends it and
	// waits for it.
	run := func(r *routing.Router, epoch uint64, gate *heldOwners) (done chan struct{}, stop func()) {
		rctx, cancel := context.WithCancel(ctx)
		done = make(chan struct{})
		go func() {
			defer close(done)
			_ = r.RunTerm(rctx, ownership.Term{Epoch: epoch})
		}()
		stop = func() {
			cancel()
			select {
			case <-gate.release:
			default:
				close(gate.release)
			}
			<-done
		}
		t.Cleanup(stop)
		return done, stop
	}
	publish := func(payload, id string) {
		t.Helper()
		h := nats.Header{contract.HeaderLevel: {"1"}}
		if id != "" {
			h.Set(contract.HeaderNatsMsgID, id)
			h.Set(contract.HeaderMergeKey, "order-42") // m2's merge check holds the routers
		}
		b.publishTo("tgt.close", payload, h)
	}

	gateA, gateB := newHeldOwners(), newHeldOwners()
	a, rb := newRouterT(gateA), newRouterT(gateB)
	doneA, _ := run(a, 5, gateA)
	publish("m1", "m1")
	waitFor("router A to route m1", func() bool { return a.Stats().Routed == 1 })
	publish("m2", "m2")
	published := time.Now()
	<-gateA.entered
	t.Log("router A (term 5) holds m2, about to write it")
	_, stopB := run(rb, 6, gateB)
	<-gateB.entered
	close(gateB.release)
	waitFor("router B (term 6) to route m2", func() bool { return rb.Stats().Routed == 1 })
	close(gateA.release)
	select {
	case <-doneA:
	case <-time.After(time.Minute):
		t.Fatalf("router A (stale) still routes a minute after B's takeover: %+v", a.Stats())
	}
	st := a.Stats()
	var fenced uint64
	for _, n := range st.FencedWrites {
		fenced += n
	}
	if st.Routed != 1 || fenced != 1 {
		t.Fatalf("stale router A: routed %d (want 1: m2's write refused), fenced %v (want once): this run does not test a refused write", st.Routed, st.FencedWrites)
	}
	stopB()

	// The index's latest record of m2 is B's placement: m2's level message.
	reader, err := jswire.NewBatchReader(b.nc, index.Batch)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rec, ok, err := index.Lookup(ctx, reader, index.UserKey("m2"), jswire.OpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if msgs, err := reader.Read(ctx, stream, nil, rec.Seq, 1, 1<<20); !ok || err != nil || len(msgs) == 0 || string(msgs[0].Data) != "m2" {
		got := "nothing"
		if len(msgs) > 0 {
			got = string(msgs[0].Data)
			if isMarkerMsg(msgs[0]) {
				got = "epoch marker " + msgs[0].Header.Get(message.HdrRouterEpoch)
			}
		}
		t.Errorf("latest index record of m2: %s sequence %d (found %v, error %v), which holds %s; want m2's level message", rec.Stream, rec.Seq, ok, err, got)
	}

	// The router lease as B would leave it: released at epoch 6.
	kv, err := b.js.KeyValue(ctx, lease.BucketName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, ownership.RouterKey, []byte(`{"v":1,"holder":"","epoch":6}`)); err != nil {
		t.Fatal(err)
	}
	b.start("S", ownerTTL, func(s *Service) { s.cfg.Levels = table })
	m, err := b.nc.Request(contract.CancelSubject, []byte("m2"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(published); elapsed >= 10*time.Second {
		t.Fatalf("cancel of m2 answered %q %s after it was published, after its due: this run does not test a pending message", m.Data, elapsed)
	}
	if string(m.Data) != contract.CancelReplyCancelled {
		t.Errorf("cancel of m2, pending: %q, want %q", m.Data, contract.CancelReplyCancelled)
	}
	publish("m3", "")
	got := b.waitPayload("m3", time.Minute)
	if contains(got, "m2") || !contains(got, "m1") {
		t.Errorf("TGT holds %q; want m1 and m3, never m2 (cancelled)", got)
	}
}

// heldOwners is a router's view of the level owners
// ([routing.Owners]) that holds the router inside its merge check:
// Pending reports each call on entered and returns false (not merged)
// once release is closed. A router held there has classified a message and
// checked its term, and is about to write it: the moment a stale router
// can be paused. (routing's marker_test.go has the same heldOwners; this test
// runs a Service, so it stays in deliver.)
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

// isMarkerMsg reports whether m, as read by direct get (its subject in the
// Nats-Subject header) or from a consumer (its own subject), is a router's
// epoch marker, for a failure message.
func isMarkerMsg(m *nats.Msg) bool {
	if s := m.Header.Get(message.HdrJSSubject); s != "" {
		return message.IsMarker(s)
	}
	return message.IsMarker(m.Subject)
}
