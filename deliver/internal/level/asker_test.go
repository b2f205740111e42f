package level

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestAskerLocalEqualsRemote asks the same Pending, Passed, Status,
// Cancel and Sift questions of a level's owner locally (the replica running its
// term) and over NATS (another replica's Level of the stream, which owns
// nothing, through its decide subject): the answers must be the same.
// A cancel asked twice, once each way, answers "cancelled" both times.
// A hop not yet due is pending though passed: its Hop and Due go over
// the wire.
func TestAskerLocalEqualsRemote(t *testing.T) {
	t.Parallel()
	b := setupScanner(t)
	lv, _ := levels.MustParse("1m").Level(1)
	stream := lv.Stream()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, hopKey := b.setup(ctx, stream)

	// d is due (delivered at once), f1..f4 an hour from now: f1 is the
	// head the owner waits for, and is never cancelled, so the tombstones
	// of f2 and f3 stay in its book (a cancelled head is passed over, and
	// its tombstone deleted once the offset passed it: then it answers
	// "delivered", and the index says "cancelled").
	subject := contract.LevelSubjectPrefix + strings.TrimPrefix(stream, levels.StreamPrefix) + ".tgt.x"
	recs := map[string]index.Record{}
	for _, m := range []struct {
		id  string
		due time.Duration
	}{{"d", -time.Minute}, {"f1", time.Hour}, {"f2", time.Hour}, {"f3", time.Hour}, {"f4", time.Hour}} {
		h := nats.Header{contract.HeaderDueAt: {contract.FormatTime(time.Now().Add(m.due))}, message.HdrMsgID: {m.id}}
		ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(m.id)})
		if err != nil {
			t.Fatal(err)
		}
		recs[m.id] = index.Record{Key: index.UserKey(m.id), Stream: stream, Seq: ack.Sequence, Target: "tgt.x"}
	}
	recs["unstored"] = index.Record{Key: index.UserKey("unstored"), Stream: stream, Seq: 99, Target: "tgt.x"}
	// d placed as a hop forwarded to its next level, due in an hour: passed
	// here, yet pending until its due (the record's Hop and Due must reach a
	// remote owner).
	dHop := recs["d"]
	dHop.Hop, dHop.Due = true, time.Now().Add(time.Hour)
	recs["d hop"] = dHop

	newLevel := func(nc *nats.Conn, js jetstream.JetStream) *Level {
		l, err := New(nc, js, Config{Stream: stream, Offsets: store, Targets: target.New(nc, js, nil)},
			Wiring{Reasons: &message.ReasonCounts{}, Refused: &message.Refusals{}, HopKey: hopKey})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	owning := newLevel(b.nc, b.js)
	nc2, err := nats.Connect(b.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc2.Close)
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	other := newLevel(nc2, js2) // never runs a term: it asks the owner over NATS

	tctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = owning.RunTerm(tctx, ownership.Term{Epoch: 1})
	}()
	defer func() { stop(); <-done }()
	for !owning.Loaded() || owning.Passed() < recs["d"].Seq {
		if ctx.Err() != nil {
			t.Fatalf("the owner did not load and deliver d in time (loaded %v, passed %d)", owning.Loaded(), owning.Passed())
		}
		time.Sleep(5 * time.Millisecond)
	}

	here := NewOwners(OwnersConfig{Conn: b.nc, Levels: map[string]*Level{stream: owning}, LeaseTTL: 5 * time.Second})
	there := NewOwners(OwnersConfig{Conn: nc2, Levels: map[string]*Level{stream: other}, LeaseTTL: 5 * time.Second})
	askers := []struct {
		name string
		a    Asker
	}{{"local", local{owning}}, {"remote", newRemote(nc2)}, {"Owners here", here}, {"Owners there", there}}
	reader, err := jswire.NewBatchReader(b.nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	same := func(what string, ask func(a Asker) string) {
		t.Helper()
		var first string
		for i, a := range askers {
			got := ask(a.a)
			if i == 0 {
				first = got
				continue
			}
			if got != first {
				t.Errorf("%s: %s answers %s, %s answers %s", what, askers[0].name, first, a.name, got)
			}
		}
		t.Logf("%s: %s", what, first)
	}
	answer := func(a CancelAnswer, err error) string {
		if err != nil {
			return "error " + err.Error()
		}
		return a.String()
	}
	pendingOf := func(id string) func(Asker) string {
		return func(a Asker) string {
			if a.Pending(ctx, recs[id]) {
				return "pending"
			}
			return "not pending"
		}
	}
	statusOf := func(id string) func(Asker) string {
		return func(a Asker) string { return answer(a.Decide(ctx, nil, recs[id], Ask{Op: AskStatus})) }
	}
	cancelOf := func(id string) func(Asker) string {
		return func(a Asker) string { return answer(a.Decide(ctx, reader, recs[id], Ask{Op: AskCancel})) }
	}

	siftOf := func(ids ...string) func(Asker) string {
		var seqs []uint64
		for _, id := range ids {
			seqs = append(seqs, recs[id].Seq)
		}
		return func(a Asker) string {
			f, err := a.Sift(ctx, stream, seqs)
			if err != nil {
				return "error " + err.Error()
			}
			return fmt.Sprintf("passed %d gone %v", f.Passed, f.Gone)
		}
	}

	same("Passed", func(a Asker) string { return strconv.FormatUint(a.Passed(ctx, stream), 10) })
	same("Sift none", siftOf())
	same("Sift all", siftOf("d", "f1", "f2", "f3", "f4", "unstored"))
	same("Pending d", pendingOf("d"))
	same("Pending d hop", pendingOf("d hop"))
	same("Pending f1", pendingOf("f1"))
	same("Status d", statusOf("d"))
	same("Status f1", statusOf("f1"))
	same("Status unstored", statusOf("unstored"))
	same("Cancel d", cancelOf("d"))
	same("Cancel unstored", cancelOf("unstored"))
	// Each asker cancels f2 (the first cancels it, the others find it
	// cancelled), and then f3 with remote first.
	same("Cancel f2", cancelOf("f2"))
	askers[0], askers[1] = askers[1], askers[0]
	same("Cancel f3", cancelOf("f3"))
	same("Pending f2 cancelled", pendingOf("f2"))
	same("Status f3 cancelled", statusOf("f3"))
	same("Pending f1", pendingOf("f1"))
	same("Pending f4", pendingOf("f4"))
	same("Sift all cancelled", siftOf("d", "f1", "f2", "f3", "f4", "unstored"))
	same("Sift f3 f2", siftOf("f3", "f2"))
	same("Passed", func(a Asker) string { return strconv.FormatUint(a.Passed(ctx, stream), 10) })
	if !owning.Cancelled(recs["f2"].Seq) || !owning.Cancelled(recs["f3"].Seq) || owning.Cancelled(recs["f1"].Seq) {
		t.Error("the owner's book: f2 and f3 not both cancelled, or f1 cancelled")
	}
}

// TestOwnersLeaseTTLDefault: Owners without a lease TTL waits for an owner
// as long as the service's default lease TTL allows, not zero (one try):
// a decision whose first answer is "not owner" (a term ending) is asked
// again, and the next owner's answer returned.
func TestOwnersLeaseTTLDefault(t *testing.T) {
	t.Parallel()
	if got := NewOwners(OwnersConfig{}).leaseTTL; got != lease.TTLDefault {
		t.Fatalf("NewOwners without LeaseTTL: lease TTL %s, want lease.TTLDefault %s", got, lease.TTLDefault)
	}
	if got := NewOwners(OwnersConfig{LeaseTTL: 5 * time.Second}).leaseTTL; got != 5*time.Second {
		t.Fatalf("NewOwners with LeaseTTL 5s: lease TTL %s", got)
	}

	nc, _ := natstest.Connect(t)
	const stream = "DELAYD_5S"
	asked := 0 // touched by the subscription's goroutine only
	sub, err := nc.Subscribe(contract.DecideSubject(stream), func(m *nats.Msg) {
		asked++
		if asked == 1 {
			_ = m.Respond([]byte(decideNotOwner)) // the old owner's term ended
			return
		}
		_ = m.Respond([]byte(decidePending)) // the next owner's answer
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := NewOwners(OwnersConfig{Conn: nc, Levels: map[string]*Level{stream: {}}}) // owned elsewhere
	if a, err := w.Decide(ctx, nil, index.Record{Key: "ix", Stream: stream, Seq: 5}, Ask{Op: AskStatus}); err != nil || a != AnswerPending {
		t.Fatalf("Status through a change of owner, without LeaseTTL: %v, %v; want %v, nil (asked again)", a, err, AnswerPending)
	}
}
