package integration

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestCancel: of 100 pending messages, the 50 cancelled are never
// delivered and the other 50 are; ids are ingress sequences and publisher
// Nats-Msg-Ids; unknown ids are not found; a delivered one says so; and
// cancelled messages cost nothing once passed (their tombstones go).
func TestCancel(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 2s")
	c := b.Collect("cancel.x")
	rec := itest.NewRecorder(t)
	rec.Subscribe(b.NC, "cancel.x")

	ids := make([]string, 100)
	for i := range ids {
		hdr := itest.Level(2)
		if i%2 == 1 {
			ids[i] = fmt.Sprintf("order-%d", i)
			hdr.Set("Nats-Msg-Id", ids[i])
			b.Publish("delay.cancel.x", []byte(strconv.Itoa(i)), hdr)
		} else {
			ids[i] = strconv.FormatUint(b.Publish("delay.cancel.x", []byte(strconv.Itoa(i)), hdr), 10)
		}
		rec.ExpectKeys(strconv.Itoa(i))
	}
	cancelled := map[string]bool{}
	for i := 0; i < len(ids); i += 4 { // 25 sequence ids
		if r := b.Cancel(ids[i]); r != delayd.Cancelled {
			t.Fatalf("cancel %s: %q, want cancelled", ids[i], r)
		}
		cancelled[strconv.Itoa(i)] = true
		rec.Excused(strconv.Itoa(i), "cancelled")
	}
	for i := 1; i < len(ids); i += 4 { // 25 publisher ids
		if r := b.Cancel(ids[i]); r != delayd.Cancelled {
			t.Fatalf("cancel %s: %q, want cancelled", ids[i], r)
		}
		cancelled[strconv.Itoa(i)] = true
		rec.Excused(strconv.Itoa(i), "cancelled")
	}
	if r := b.Cancel(ids[1]); r != delayd.Cancelled {
		t.Errorf("cancelling twice: %q, want cancelled again", r)
	}
	for _, unknown := range []string{"no-such-id", "999999"} {
		if r := b.Cancel(unknown); r != delayd.NotFound {
			t.Errorf("cancel %q: %q, want not found", unknown, r)
		}
	}
	if m, err := b.NC.Request(delayd.CancelSubject, []byte(" "), 5*time.Second); err != nil || string(m.Data) != "not found" {
		t.Errorf("cancel with an empty id: %v %v, want not found", m, err)
	}
	// Each answer's body is its text and its Delay-Status its code.
	b.WantCancelReply(ids[1], "cancelled", "200")
	b.WantCancelReply("no-such-id", "not found", "404")

	// The last message published (99, not cancelled) is delivered last: the
	// level is FIFO, so every message before it has been passed by then.
	itest.WaitFor(t, 15*time.Second, "message 99 delivered", func() bool { return rec.Counts()["99"] > 0 })
	rec.CheckAll()
	// c is a second subscription: its callbacks run on a goroutine of their
	// own and may trail rec's.
	itest.WaitFor(t, 10*time.Second, "50 deliveries at the second subscriber", func() bool { return len(c.Snapshot()) >= 50 })
	got := c.Snapshot()
	if len(got) != 50 {
		t.Fatalf("delivered %d, want exactly 50", len(got))
	}
	for _, r := range got {
		if cancelled[string(r.Msg.Data)] {
			t.Errorf("cancelled message %s was delivered", r.Msg.Data)
		}
	}
	if r := b.Cancel(ids[2]); r != delayd.AlreadyDelivered {
		t.Errorf("cancel of a delivered message: %q, want already delivered", r)
	}
	if r := b.Cancel(ids[3]); r != delayd.AlreadyDelivered {
		t.Errorf("cancel of a delivered message by publisher id: %q, want already delivered", r)
	}
	b.WantCancelReply(ids[2], "already delivered", "409")
	var n uint64
	_, ss := b.Svc.Stats()
	for _, s := range ss {
		n += s.Cancelled
	}
	if n != 50 {
		t.Errorf("scanners counted %d cancelled, want 50", n)
	}
	itest.WaitFor(t, 10*time.Second, "tombstones deleted once passed", func() bool { return b.StreamCount(deliver.CancelStream) == 0 })
}

// TestCancelCascade cancels a Delay-Duration message after it moved on to
// a later level, and checks a cancelled message stays cancelled across a
// restart of delayd.
func TestCancelCascade(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 500ms")
	c := b.Collect("cascade.cancel")
	hdr := nats.Header{contract.HeaderDuration: []string{"1500ms"}}
	hop := strconv.FormatUint(b.Publish("delay.cascade.cancel", []byte("hop"), hdr), 10)
	hdr = nats.Header{contract.HeaderDuration: []string{"1500ms"}, "Nats-Msg-Id": []string{"restart-1"}}
	b.Publish("delay.cascade.cancel", []byte("restart"), hdr)
	keep := b.Publish("delay.cascade.cancel", []byte("keep"), nats.Header{contract.HeaderDuration: []string{"1500ms"}})
	itest.WaitFor(t, 10*time.Second, "past the first hop", func() bool { return b.Forwarded() >= 3 })
	if r := b.Cancel(hop); r != delayd.Cancelled {
		t.Fatalf("cancel after a hop: %q", r)
	}
	if r := b.Cancel("restart-1"); r != delayd.Cancelled {
		t.Fatalf("cancel: %q", r)
	}
	b.StopDelayd()
	b.StartDelayd("200ms 500ms")
	c.Wait(t, 1, 10*time.Second)
	// Let time pass: the cancelled ones, due with keep, would show now.
	itest.WaitQuiet(t, time.Second, 10*time.Second, func() int { return len(c.Snapshot()) })
	got := c.Snapshot()
	if len(got) != 1 || string(got[0].Msg.Data) != "keep" {
		var data []string
		for _, r := range got {
			data = append(data, string(r.Msg.Data))
		}
		t.Fatalf("delivered %q, want only keep (seq %d)", data, keep)
	}
}

// TestCancelRace sends each cancel around its message's due instant: every
// message is delivered or cancelled, never both and never neither, the reply
// says which, and both outcomes occur (the race is really run).
func TestCancelRace(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms")
	rec := itest.NewRecorder(t)
	rec.Subscribe(b.NC, "race.x")
	const n = 200
	replies := map[string]delayd.CancelResult{}
	for i := range n {
		seq := b.Publish("delay.race.x", []byte(strconv.Itoa(i)), itest.Level(1))
		rec.ExpectKeys(strconv.Itoa(i))
		// Let time pass: up to the due instant, 100 ms after the store, give
		// or take.
		time.Sleep(time.Duration(80+i%40) * time.Millisecond)
		replies[strconv.Itoa(i)] = b.Cancel(strconv.FormatUint(seq, 10))
	}
	var nCancelled, nDelivered int
	for i := range n {
		id := strconv.Itoa(i)
		switch replies[id] {
		case delayd.Cancelled:
			nCancelled++
			rec.Excused(id, "cancelled")
		case delayd.AlreadyDelivered:
			nDelivered++
		default:
			t.Errorf("message %s: reply %q", id, replies[id])
		}
	}
	itest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries", nDelivered), func() bool { return len(rec.Snapshot()) >= nDelivered })
	itest.WaitQuiet(t, 500*time.Millisecond, 10*time.Second, func() int { return len(rec.Snapshot()) }) // a cancelled one delivered late would show now
	t.Logf("%d tries at the due instant: %d cancelled, %d already delivered", n, nCancelled, nDelivered)
	rec.CheckAll() // each "already delivered" delivered once, each "cancelled" never
	if nCancelled == 0 || nDelivered == 0 {
		t.Errorf("%d cancelled, %d already delivered: want both outcomes of the race", nCancelled, nDelivered)
	}
}

// TestMerge: 1,000 messages with 10 merge keys, published inside the
// first's wait, are delivered as 10 messages, each the first of its key at
// its due time; after that the key is free again. The level is 15 s: under
// -race on a loaded 2-core machine publishing the 1,000 took 5 s, longer
// than the 3 s level this test had, and the last ones then began groups of
// their own (merged 980).
func TestMerge(t *testing.T) {
	t.Parallel()
	const wait = 15 * time.Second
	b := itest.Setup(t)
	b.CreateStream("MERGE", "merge.>")
	b.StartDelayd("15s")
	start := time.Now()
	for i := range 1000 {
		hdr := itest.Level(1)
		hdr.Set(contract.HeaderMergeKey, "user-"+strconv.Itoa(i%10))
		b.Publish("delay.merge.x", []byte(strconv.Itoa(i)), hdr)
	}
	took := time.Since(start)
	t.Logf("published 1,000 in %s", took)
	if took >= wait {
		t.Fatalf("publishing the 1,000 took %s, not inside the first's wait of %s: the test cannot tell merging from its absence", took, wait)
	}
	itest.WaitFor(t, wait+10*time.Second, "10 deliveries", func() bool { return b.StreamCount("MERGE") >= 10 })
	// Every message in the level passed: nothing else will follow.
	itest.WaitFor(t, 10*time.Second, "DELAYD_15S offset at its 10 messages", func() bool { return b.ScannerStats("DELAYD_15S").Offset >= 10 })
	msgs := b.StreamMsgs("MERGE")
	if len(msgs) != 10 {
		t.Fatalf("delivered %d, want 10", len(msgs))
	}
	for _, m := range msgs {
		i, _ := strconv.Atoi(string(m.Data))
		if i >= 10 {
			t.Errorf("delivered message %d: want the first of its key (0..9)", i)
		}
		enq, due := parseTime(t, m.Header, contract.HeaderEnqueuedAt), parseTime(t, m.Header, contract.HeaderDueAt)
		if due.Sub(enq) != wait || m.Time.Before(due) {
			t.Errorf("message %d: enqueued %v due %v delivered %v", i, enq, due, m.Time)
		}
		if m.Header.Get(contract.HeaderMergeKey) != "" {
			t.Errorf("message %d: Delay-Merge-Key delivered", i)
		}
	}
	rs, _ := b.Svc.Stats()
	if rs.Merged != 990 {
		t.Errorf("merged %d, want 990", rs.Merged)
	}
	// The key is free again: a new message is delivered on its own.
	hdr := itest.Level(1)
	hdr.Set(contract.HeaderMergeKey, "user-0")
	b.Publish("delay.merge.x", []byte("again"), hdr)
	itest.WaitFor(t, wait+10*time.Second, "the key free again", func() bool { return b.StreamCount("MERGE") == 11 })
}

// TestCancelNumericIDs: a publisher's Nats-Msg-Id that is also an ingress
// sequence is ambiguous and cancels nothing; seq:N and id:N say which.
func TestCancelNumericIDs(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("2s")
	c := b.Collect("num.x")
	for i := range 3 {
		if seq := b.Publish("delay.num.x", []byte(fmt.Sprint("seq-", i)), itest.Level(1)); seq != uint64(i+1) {
			t.Fatalf("ingress sequence %d, want %d", seq, i+1)
		}
	}
	for _, id := range []string{"2", "3", "77", "seq:1"} {
		hdr := itest.Level(1)
		hdr.Set("Nats-Msg-Id", id)
		b.Publish("delay.num.x", []byte("id-"+id), hdr)
	}
	for _, id := range []string{"2", "seq:1"} { // each names two messages
		m, err := b.NC.Request(delayd.CancelSubject, []byte(id), 10*time.Second)
		if err != nil || !strings.HasPrefix(string(m.Data), "error: ambiguous id") {
			t.Fatalf("cancel %s: %v %v, want an ambiguous id error", id, m, err)
		}
		if got := m.Header.Get(contract.HeaderStatus); got != "400" {
			t.Errorf("cancel %s: %s %q, want 400", id, contract.HeaderStatus, got)
		}
		// A Go caller gets it as a typed error, with the reply's text.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := delayd.CancelAny(ctx, b.NC, id)
		cancel()
		if r != "" || !errors.Is(err, delayd.ErrAmbiguousID) || !errors.Is(err, delayd.ErrCancelReply) || errors.Is(err, delayd.ErrRouterBehind) {
			t.Errorf("CancelAny(%s) = %q, %v; want ErrAmbiguousID and ErrCancelReply", id, r, err)
		} else if want := "delayd: unexpected cancel reply: " + strconv.Quote(string(m.Data)); err.Error() != want {
			t.Errorf("CancelAny(%s) error %q, want %q", id, err, want)
		}
	}
	for id, want := range map[string]delayd.CancelResult{"seq:2": delayd.Cancelled, "id:3": delayd.Cancelled, "77": delayd.Cancelled, "seq:77": delayd.NotFound, "id:1": delayd.NotFound, "id:seq:1": delayd.Cancelled} {
		if r := b.Cancel(id); r != want {
			t.Errorf("cancel %s: %q, want %q", id, r, want)
		}
	}
	c.Wait(t, 3, 10*time.Second)
	// Every message in the level passed: nothing else will follow.
	itest.WaitFor(t, 10*time.Second, "DELAYD_2S offset at its 7 messages", func() bool { return b.ScannerStats("DELAYD_2S").Offset >= 7 })
	var got []string
	for _, r := range c.Snapshot() {
		got = append(got, string(r.Msg.Data))
	}
	slices.Sort(got)
	if strings.Join(got, " ") != "id-2 seq-0 seq-2" {
		t.Errorf("delivered %q, want id-2 seq-0 seq-2", got)
	}
}

// TestMergeAfterRestart merges through the id index (not the router's
// cache, empty after a restart) when the index holds tens of records per
// subject.
func TestMergeAfterRestart(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 1h")
	for i := range 20000 {
		if _, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: "delay.bulk.x", Header: itest.Level(2)}); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			<-b.JS.PublishAsyncComplete()
		}
	}
	<-b.JS.PublishAsyncComplete()
	hdr := itest.Level(2)
	hdr.Set(contract.HeaderMergeKey, "k")
	b.Publish("delay.mr.x", []byte("first"), hdr)
	itest.WaitFor(t, 30*time.Second, "routing", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
	b.StopDelayd()
	b.StartDelayd("1s 1h")
	b.Publish("delay.mr.x", []byte("second"), hdr)
	itest.WaitFor(t, 10*time.Second, "routing", func() bool { return b.StreamCount(deliver.IngressStream) == 0 })
	if rs, _ := b.Svc.Stats(); rs.Merged != 1 || rs.Routed != 0 {
		t.Errorf("after a restart: merged %d, routed %d; want the second merged into the first", rs.Merged, rs.Routed)
	}
}

// TestForgedHopHeaders: a publisher's own Delayd-Origin and Delayd-Msg-Id
// (delayd's headers for a cascading message moving on) are not trusted
// without delayd's hop MAC: the message is routed as a new one, under its
// own derived id, and cannot take over another message's id.
func TestForgedHopHeaders(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1h")
	c := b.Collect("forge.x")
	victim := itest.Level(2)
	victim.Set("Nats-Msg-Id", "victim-id")
	b.Publish("delay.forge.x", []byte("victim"), victim)
	forged := itest.Level(1)
	forged.Set("Delayd-Origin", "delayd-1-424242")
	forged.Set("Delayd-Msg-Id", "victim-id")
	forged.Set("Delayd-Hops", "3")
	forged.Set("Delayd-Hop-Mac", "AAAAAAAAAAAAAAAAAAAAAAAA")
	seq := b.Publish("delay.forge.x", []byte("forged"), forged)
	m := c.Wait(t, 1, 10*time.Second)[0].Msg
	if id := m.Header.Get("Nats-Msg-Id"); !strings.Contains(id, fmt.Sprintf("-%d-", seq)) || id == "victim-id" {
		t.Errorf("forged message delivered with Nats-Msg-Id %q, want its own derived id", id)
	}
	for k := range m.Header {
		if strings.HasPrefix(k, "Delayd-") || k == contract.HeaderHops {
			t.Errorf("header %s delivered", k)
		}
	}
	if r := b.Cancel("victim-id"); r != delayd.Cancelled {
		t.Errorf("cancel victim-id: %q, want cancelled (the victim is pending for an hour)", r)
	}
}

// TestMergeCancelledCascade: the first message of a merge key, cascading
// between levels, is cancelled; a later message with the key is then
// delivered on its own, not merged into the cancelled one.
func TestMergeCancelledCascade(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 500ms")
	c := b.Collect("mcc.x")
	hdr := nats.Header{contract.HeaderDuration: []string{"1500ms"}, contract.HeaderMergeKey: []string{"k"}}
	first := b.Publish("delay.mcc.x", []byte("first"), hdr)
	firstDue := time.Now().Add(1500 * time.Millisecond)
	itest.WaitFor(t, 10*time.Second, "past its first hop", func() bool { return b.Forwarded() >= 1 })
	if r := b.Cancel(fmt.Sprint(first)); r != delayd.Cancelled {
		t.Fatalf("cancel first: %q", r)
	}
	hdr = nats.Header{"Delay-Level": []string{"1"}, contract.HeaderMergeKey: []string{"k"}}
	b.Publish("delay.mcc.x", []byte("second"), hdr)
	c.Wait(t, 1, 10*time.Second)
	time.Sleep(time.Until(firstDue)) // let time pass: the first's due time passes
	itest.WaitQuiet(t, 300*time.Millisecond, 10*time.Second, func() int { return len(c.Snapshot()) })
	got := c.Snapshot()
	if len(got) != 1 || string(got[0].Msg.Data) != "second" {
		t.Errorf("delivered %d messages (first %q), want only second", len(got), got[0].Msg.Data)
	}
}

// TestMergeIntoCancelledHopAfterCommit: as TestMergeCancelledCascade, but
// with traffic in the levels after the cancel, so the level's offset passes
// the cancelled message and its tombstone is deleted before the later
// message with the key arrives.
func TestMergeIntoCancelledHopAfterCommit(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 500ms")
	c := b.Collect("mch.x")
	hdr := nats.Header{contract.HeaderDuration: []string{"6s"}, contract.HeaderMergeKey: []string{"k"}}
	first := b.Publish("delay.mch.x", []byte("first"), hdr)
	itest.WaitFor(t, 10*time.Second, "past its first hop", func() bool { return b.Forwarded() >= 1 })
	if r := b.Cancel(fmt.Sprint(first)); r != delayd.Cancelled {
		t.Fatalf("cancel first: %q", r)
	}
	for i := range 4 { // traffic in the level, so its offset commits are acknowledged
		b.Publish("delay.other.x", []byte(fmt.Sprint(i)), itest.Level(2))
		time.Sleep(600 * time.Millisecond) // let time pass: traffic spread over the level's delays
	}
	itest.WaitFor(t, 10*time.Second, "the tombstone deleted", func() bool { return b.StreamCount(deliver.CancelStream) == 0 })
	b.Publish("delay.mch.x", []byte("second"), nats.Header{"Delay-Level": []string{"1"}, contract.HeaderMergeKey: []string{"k"}})
	got := c.Wait(t, 1, 10*time.Second)
	if string(got[0].Msg.Data) != "second" {
		t.Errorf("delivered %q, want second", got[0].Msg.Data)
	}
	if rs, _ := b.Svc.Stats(); rs.Merged != 0 {
		t.Errorf("merged %d into a cancelled message", rs.Merged)
	}
}

// TestHopIDNotGuessable: a publisher that sends a message with the
// Nats-Msg-Id a cascading message's next hop would have under a guessable
// scheme (first id + hop number) cannot make the hop be dropped as its
// duplicate at ingress; and one that writes to a stream-bound target under
// the id a pending message will be delivered with, guessed from an id it
// saw delivered (same form, the other ingress sequence, with or without
// the seen id's MAC), cannot make that delivery be dropped as its
// duplicate. Delivery ids are "delayd-<ingress created>-<seq>-<MAC>" and
// hop ids "delayd-hop-<MAC>" (deliver/internal/hop/hop.go); without the MAC the
// guesses below would be exact.
func TestHopIDNotGuessable(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.CreateStream("SQUAT", "squat.>")
	b.StartDelayd("1s")
	info, err := b.JS.Stream(context.Background(), deliver.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	created := info.CachedInfo().Created.UnixNano()

	// An id the attacker sees delivered.
	seen := b.Publish("delay.squat.seen", []byte("seen"), itest.Level(0))
	itest.WaitFor(t, 10*time.Second, "the seen message delivered", func() bool { return b.StreamCount("SQUAT") == 1 })
	seenID := b.StreamMsgs("SQUAT")[0].Header.Get(contract.HeaderNatsMsgID)
	prefix := fmt.Sprintf("delayd-%d-%d", created, seen)
	if !strings.HasPrefix(seenID, prefix) {
		t.Fatalf("delivered with Nats-Msg-Id %q, want the derived form %s…", seenID, prefix)
	}
	mac := strings.TrimPrefix(seenID, prefix)

	seq := b.Publish("delay.squat.victim", []byte("victim"), nats.Header{contract.HeaderDuration: []string{"1500ms"}})
	victimRef := fmt.Sprintf("delayd-%d-%d", created, seq)
	for _, id := range []string{victimRef + "-hop1", victimRef} { // at ingress: the hop's id under a guessable scheme
		hdr := itest.Level(0)
		hdr.Set("Nats-Msg-Id", id)
		b.Publish("delay.squat.attacker", []byte(id), hdr)
	}
	for _, id := range []string{victimRef, victimRef + mac} { // at the target, before the victim's delivery
		if _, err := b.JS.Publish(context.Background(), "squat.victim", []byte("squatter "+id), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	itest.WaitFor(t, 10*time.Second, "the victim delivered", func() bool {
		for _, m := range b.StreamMsgs("SQUAT") {
			if string(m.Data) == "victim" {
				return true
			}
		}
		return false
	})
}

// TestCancelAnswersAfterLeaving: a message that waited longer than the
// index keeps records (IndexKeep, 2 s here) still answers truly for
// IndexKeep after it left its level, while a shorter level churns: a
// delivered one "already delivered", a cancelled one "cancelled". With
// the kept answers' keep short too (AnswerKeep 1 s), it is then
// forgotten (TestAnswersOutliveIndex: with the default, it is not).
func TestCancelAnswersAfterLeaving(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 5s", func(c *deliver.Config) { c.IndexKeep, c.AnswerKeep = 2*time.Second, time.Second })
	c := b.Collect("leave.x")
	for _, id := range []string{"leave-a", "leave-m"} {
		hdr := itest.Level(2)
		hdr.Set("Nats-Msg-Id", id)
		b.Publish("delay.leave.x", []byte(id), hdr)
	}
	if r := b.Cancel("leave-m"); r != delayd.Cancelled {
		t.Fatalf("cancel leave-m: %q", r)
	}
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() { // heads of the short level keep moving
		defer close(churned)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond): // pacing the churn, not a correctness wait
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: "delay.churn.x", Header: itest.Level(1)})
				cancel()
				if err != nil {
					t.Errorf("churn publish: %v", err) // not t.Fatal: this is not the test's goroutine
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-churned }()
	c.Wait(t, 1, 15*time.Second)
	left := time.Now()
	for time.Since(left) < 1500*time.Millisecond {
		if r := b.Cancel("leave-a"); r != delayd.AlreadyDelivered {
			t.Fatalf("%s after leave-a was delivered: %q, want already delivered", time.Since(left).Round(time.Millisecond), r)
		}
		if r := b.Cancel("leave-m"); r != delayd.Cancelled {
			t.Fatalf("%s after leave-m left: %q, want cancelled", time.Since(left).Round(time.Millisecond), r)
		}
		time.Sleep(200 * time.Millisecond) // let time pass: ask again and again over 1.5 s
	}
	// Long after: the records and the kept answers are gone, the index
	// does not grow.
	itest.WaitFor(t, 30*time.Second, "leave-a forgotten", func() bool { return b.Cancel("leave-a") == delayd.NotFound })
}

// TestCancelScopeOldRecords: index records written before records carried
// the target (the 5-field form) still answer. A scoped cancel checks a
// placement's target against its level message (the wrong target: not
// found; the right one: cancelled); a "cancelled" record without a target
// answers not found in any scope, and cancelled to the unscoped form.
func TestCancelScopeOldRecords(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1h")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := delayd.Publish(ctx, b.JS, "legacy.x", []byte("old"), delayd.WithLevel(2), delayd.WithMsgID("legacy-1")); err != nil {
		t.Fatal(err)
	}
	itest.WaitFor(t, 10*time.Second, "legacy-1 in DELAYD_1H", func() bool { return b.LevelCount("DELAYD_1H") == 1 })
	seq := b.LevelMsgs("DELAYD_1H")[0].Sequence
	// The records an older delayd wrote: a placement of legacy-1, and a
	// cancelled legacy-2, both without a target.
	oldRecord := func(key, rest string) {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		subject := fmt.Sprintf("delayd.idx.%d", h.Sum64()%deliver.IndexSlots)
		data := fmt.Sprintf("%s %d\n%s", rest, len(key), key)
		if _, err := b.JS.Publish(ctx, subject, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	oldRecord("ulegacy-1", fmt.Sprintf("DELAYD_1H %d - %d", seq, time.Now().Add(time.Hour).UnixNano()))
	oldRecord("ulegacy-2", fmt.Sprintf(" 0 c %d", time.Now().UnixNano()))

	for _, c := range []struct {
		target, id string
		want       delayd.CancelResult
	}{
		{"other.x", "legacy-1", delayd.NotFound},
		{"legacy.x", "legacy-1", delayd.Cancelled},
		{"legacy.x", "legacy-2", delayd.NotFound},
	} {
		if r, err := delayd.Cancel(ctx, b.NC, c.target, c.id); err != nil || r != c.want {
			t.Errorf("cancel %s %s: %q %v, want %q", c.target, c.id, r, err, c.want)
		}
	}
	if r := b.Cancel("legacy-2"); r != delayd.Cancelled {
		t.Errorf("unscoped cancel of legacy-2: %q, want cancelled", r)
	}
}

// TestCancelStormAnswered: a burst of cancel requests far beyond what
// delayd works through at once gets an answer for every request, none
// dropped: those beyond the queue (deliver.CancelQueueMax) are answered
// busy (429) at once, the others with their real answer; a pending message
// answered cancelled is never delivered, and the busy ones can be sent
// again and then answer as usual.
func TestCancelStormAnswered(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	// A 20 s level: the storm and the busy ones sent again one at a time
	// end long before the messages are due (with 2 s, CI under -race took
	// longer, and correctly answered "already delivered" to later ones).
	b.StartDelayd("20s", func(c *deliver.Config) { c.CancelLookupShare = 0 }) // the default pacing
	rec := itest.NewRecorder(t)
	rec.Subscribe(b.NC, "storm.x")
	const pending, requests = 100, 4000
	for i := range pending {
		hdr := itest.Level(1)
		hdr.Set("Nats-Msg-Id", fmt.Sprintf("storm-%d", i))
		b.Publish("delay.storm.x", []byte(strconv.Itoa(i)), hdr)
		rec.ExpectKeys(strconv.Itoa(i))
	}
	// A connection of its own, with no limit on pending replies, so the
	// client drops none of them.
	nc, err := nats.Connect(b.Srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, requests)
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) { replies <- m })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	// Every 40th request cancels a pending message (spread over the
	// storm, so some of them find the queue full), the others an unknown
	// id.
	const every = requests / pending
	msgOf := func(k int) (int, bool) { return k / every, k%every == every-1 }
	id := func(k int) string {
		if j, ok := msgOf(k); ok {
			return fmt.Sprintf("storm-%d", j)
		}
		return fmt.Sprintf("no-such-%d", k)
	}
	for k := range requests {
		if err := nc.PublishMsg(&nats.Msg{Subject: delayd.CancelSubject, Reply: inbox + "." + strconv.Itoa(k), Data: []byte(id(k))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := map[int]*nats.Msg{}
	deadline := time.After(60 * time.Second)
	for len(got) < requests {
		select {
		case m := <-replies:
			k, _ := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
			got[k] = m
		case <-deadline:
			t.Fatalf("%d of %d cancel requests answered within 60 s: the rest were dropped", len(got), requests)
		}
	}
	busy := 0
	var retry []int
	for k, m := range got {
		body, status := string(m.Data), m.Header.Get(contract.HeaderStatus)
		j, isPending := msgOf(k)
		switch {
		case status == "429":
			busy++
			if body != "error: busy: too many cancel requests waiting; try again" {
				t.Errorf("request %d: busy answer %q", k, body)
			}
			if isPending {
				retry = append(retry, k)
			}
		case isPending:
			if body != "cancelled" || status != "200" {
				t.Errorf("request %d for pending %s: %q %s, want cancelled 200", k, id(k), body, status)
			}
			rec.Excused(strconv.Itoa(j), "cancelled")
		default:
			if body != "not found" || status != "404" {
				t.Errorf("request %d for unknown %s: %q %s, want not found 404", k, id(k), body, status)
			}
		}
	}
	if busy == 0 {
		t.Fatalf("no request was answered busy: %d requests did not fill the queue of %d, so the storm was not one", requests, deliver.CancelQueueMax)
	}
	if st := b.Svc.CancelStats(); st.Busy != uint64(busy) {
		t.Errorf("CancelStats().Busy = %d, want %d", st.Busy, busy)
	}
	// Sent again one at a time, after a pause when busy (as
	// docs/guide.md#cancel tells a client to), the busy ones answer as usual.
	for _, k := range retry {
		var r delayd.CancelResult
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			res, err := delayd.CancelAny(ctx, b.NC, id(k))
			cancel()
			if errors.Is(err, delayd.ErrCancelBusy) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond) // the pause docs/guide.md#cancel asks for
				continue
			}
			if err != nil {
				t.Fatalf("cancel %s again after busy: %v", id(k), err)
			}
			r = res
			break
		}
		if r != delayd.Cancelled {
			t.Errorf("cancel %s again after busy: %q, want cancelled", id(k), r)
		}
		j, _ := msgOf(k)
		rec.Excused(strconv.Itoa(j), "cancelled")
	}
	t.Logf("%d requests: %d busy (%d of them for pending messages, sent again)", requests, busy, len(retry))
	// A last message, not cancelled: the level is FIFO, so once it is
	// delivered every cancelled one before it has been passed.
	b.Publish("delay.storm.x", []byte("last"), itest.Level(1))
	rec.ExpectKeys("last")
	itest.WaitFor(t, time.Minute, "the last message delivered", func() bool { return rec.Counts()["last"] > 0 })
	rec.CheckAll()
}

// TestCancelLookupConnection: the delayd binary reads the id index for
// cancels on a connection of its own, named "delayd-lookups", not on the
// connection that routes and delivers. nats-server answers a connection's
// direct gets inline, on that connection's read loop, and a lookup walks
// DELAYD_INDEX: on the delivering connection every delivery sent behind a
// lookup would wait for the walk (deliver.Config.LookupConn,
// docs/guarantees.md#what-a-cancel-costs).
func TestCancelLookupConnection(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartProcess("DELAYD_LEVELS=1s 1m")
	// What each of delayd's connections has sent the server, by name.
	sent := func() map[string]uint64 {
		cz, err := b.Srv.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, c := range cz.Conns {
			if strings.HasPrefix(c.Name, "delayd") {
				out[c.Name] += uint64(c.InMsgs)
			}
		}
		return out
	}
	itest.WaitFor(t, 30*time.Second, "delayd's streams and both connections", func() bool {
		s := sent()
		_, err := b.JS.Stream(context.Background(), deliver.IngressStream)
		_, main := s["delayd"]
		_, lookups := s["delayd-lookups"]
		return err == nil && main && lookups
	})
	hdr := itest.Level(2) // 1 m: pending throughout
	hdr.Set("Nats-Msg-Id", "lookup-conn-1")
	b.Publish("delay.lookup.x", []byte("x"), hdr)
	itest.WaitFor(t, 30*time.Second, "the message placed in DELAYD_1M", func() bool {
		_, err := b.JS.Stream(context.Background(), "DELAYD_1M")
		return err == nil && b.LevelCount("DELAYD_1M") >= 1
	})
	before := sent()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		r   delayd.CancelResult
		err error
	)
	for { // the cancel API subscribes once delayd is ready: no responders before
		if r, err = delayd.Cancel(ctx, b.NC, "lookup.x", "lookup-conn-1"); !errors.Is(err, nats.ErrNoResponders) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || r != delayd.Cancelled {
		t.Fatalf("cancel: %q %v, want cancelled", r, err)
	}
	after := sent()
	if after["delayd-lookups"] <= before["delayd-lookups"] {
		t.Errorf("the lookup connection sent %d messages before the cancel and %d after: the lookups went elsewhere (delayd sent %d then %d)",
			before["delayd-lookups"], after["delayd-lookups"], before["delayd"], after["delayd"])
	}
}
