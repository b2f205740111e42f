package integration

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestTargetFailureFullStream delivers to a target stream that refuses
// writes (full, discard new) in the same level as a healthy target, with a
// second level beside them. The failing target must hold up neither the other
// level (all of the other level's messages arrive while it still fails) nor
// cause a flood of re-deliveries to the healthy target of its own level, and
// once it has room every message must arrive, once and in order.
func TestTargetFailureFullStream(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	ctx := context.Background()
	fullCfg := jetstream.StreamConfig{
		Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 5, Discard: jetstream.DiscardNew, Storage: jetstream.FileStorage,
	}
	if _, err := b.JS.CreateStream(ctx, fullCfg); err != nil {
		t.Fatal(err)
	}
	b.CreateStream("OK", "ok.>")
	b.StartDelayd("100ms 300ms")

	// Every raw publish to ok.a, whether the OK stream keeps it or drops it
	// as a duplicate.
	var (
		rawMu sync.Mutex
		raw   = make(map[string]int) // Nats-Msg-Id -> arrivals
		nRaw  int
	)
	sub, err := b.NC.Subscribe("ok.a", func(m *nats.Msg) {
		rawMu.Lock()
		raw[m.Header.Get(contract.HeaderNatsMsgID)]++
		nRaw++
		rawMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}

	const nFull, nA, nB = 20, 20, 50
	start := time.Now()
	for i := range nB {
		if i < nFull {
			b.Publish("delay.full.x", fmt.Appendf(nil, "full-%02d", i), itest.Level(1))
		}
		if i < nA {
			b.Publish("delay.ok.a", fmt.Appendf(nil, "a-%02d", i), itest.Level(1))
		}
		b.Publish("delay.ok.b", fmt.Appendf(nil, "b-%02d", i), itest.Level(2))
	}
	t.Logf("published %d messages in %s", nFull+nA+nB, time.Since(start))

	okMsgs := func(subject string) []*jetstream.RawStreamMsg {
		var out []*jetstream.RawStreamMsg
		for _, m := range b.StreamMsgs("OK") {
			if m.Subject == subject {
				out = append(out, m)
			}
		}
		return out
	}

	// The other level is not held up by the failing target: every ok.b
	// (published while full.x was already failing) is delivered, never
	// early, before the failing target recovers, and while its level keeps
	// retrying.
	itest.WaitFor(t, 10*time.Second, "level 1 retrying the full target", func() bool { return b.ScannerStats("DELAYD_100MS").Retries > 0 })
	itest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d ok.b messages in OK", nB), func() bool { return len(okMsgs("ok.b")) >= nB })
	if n := b.StreamCount("FULL"); n != 5 {
		t.Fatalf("FULL holds %d messages when level 2 is done, want 5: the failure is not ongoing", n)
	}
	recB := itest.NewRecorder(t)
	for i := range nB {
		recB.ExpectKeys(fmt.Sprintf("b-%02d", i))
	}
	recB.AddStream(okMsgs("ok.b"))
	recB.CheckAll()
	var late []time.Duration
	for _, m := range okMsgs("ok.b") {
		late = append(late, m.Time.Sub(parseTime(t, m.Header, contract.HeaderDueAt)))
	}
	slices.Sort(late)
	t.Logf("ok.b lateness over %d deliveries: p50=%s max=%s", len(late), itest.Percentile(late, 50), late[len(late)-1])

	// Let the failing level retry a while: ten retries, counted.
	retries0 := b.ScannerStats("DELAYD_100MS").Retries
	itest.WaitFor(t, 30*time.Second, "ten more retries of the full target", func() bool { return b.ScannerStats("DELAYD_100MS").Retries >= retries0+10 })
	if n := b.StreamCount("FULL"); n != 5 {
		t.Errorf("FULL holds %d messages, want 5", n)
	}
	rawMu.Lock()
	t.Logf("after %d retries of a full target: %d raw publishes of ok.a, %d distinct ids; %d ok.a in OK",
		b.ScannerStats("DELAYD_100MS").Retries, nRaw, len(raw), len(okMsgs("ok.a")))
	for id, n := range raw {
		if n > 2 {
			t.Errorf("ok.a %s published %d times while FULL was full, want at most 2", id, n)
		}
	}
	rawMu.Unlock()
	checkNoDupIDs(t, b.StreamMsgs("OK"))
	_, ss := b.Svc.Stats()
	for _, st := range ss {
		t.Logf("scanner %s: delivered=%d retries=%d dead-lettered=%d offset=%d", st.Stream, st.Delivered, st.Retries, st.DeadLettered, st.Offset)
	}

	// Make room: every full.x arrives, in publish order, and every ok.a is in
	// OK exactly once.
	fullCfg.MaxMsgs = -1
	if _, err := b.JS.UpdateStream(ctx, fullCfg); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	itest.WaitFor(t, 20*time.Second, fmt.Sprintf("%d messages in FULL", nFull), func() bool { return b.StreamCount("FULL") >= nFull })
	t.Logf("FULL complete %s after it had room", time.Since(freed))
	itest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d ok.a messages in OK", nA), func() bool { return len(okMsgs("ok.a")) >= nA })
	itest.WaitQuiet(t, 500*time.Millisecond, 10*time.Second, func() int { rawMu.Lock(); defer rawMu.Unlock(); return nRaw }) // any late duplicate shows up

	var order []string
	for _, m := range b.StreamMsgs("FULL") {
		order = append(order, string(m.Data))
	}
	var want []string
	for i := range nFull {
		want = append(want, fmt.Sprintf("full-%02d", i))
	}
	if !slices.Equal(order, want) {
		t.Errorf("FULL holds %q, want %q (publish order, once each)", order, want)
	}
	recA := itest.NewRecorder(t)
	for i := range nA {
		recA.ExpectKeys(fmt.Sprintf("a-%02d", i))
	}
	recA.AddStream(okMsgs("ok.a"))
	recA.CheckAll() // each a-NN in OK once, never early
	recFull := itest.NewRecorder(t)
	recFull.AddStream(b.StreamMsgs("FULL"))
	recFull.CheckNeverEarly()
	checkNoDupIDs(t, b.StreamMsgs("OK"))
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		t.Errorf("DELAYD_DLQ holds %d messages, want 0 (a full stream is a transient failure)", n)
	}
	rawMu.Lock()
	t.Logf("in all: %d raw publishes of ok.a for %d messages", nRaw, nA)
	rawMu.Unlock()
}

// checkNoDupIDs fails if two messages of a stream share a Nats-Msg-Id.
func checkNoDupIDs(t *testing.T, msgs []*jetstream.RawStreamMsg) {
	t.Helper()
	ids := make(map[string]uint64)
	for _, m := range msgs {
		id := m.Header.Get(contract.HeaderNatsMsgID)
		if prev, ok := ids[id]; ok {
			t.Errorf("OK holds Nats-Msg-Id %q twice: sequences %d and %d", id, prev, m.Sequence)
		}
		ids[id] = m.Sequence
	}
}

// TestTargetFailureTooLargeIsLast delivers one message that its target stream
// refuses for good (over its max message size), with nothing after it in its
// level: no later traffic wakes the scanner, so it must retry and then
// dead-letter on its own.
func TestTargetFailureTooLargeIsLast(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	if _, err := b.JS.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 100, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	b.StartDelayd("100ms")

	data := bytes.Repeat([]byte{0xcd}, 1024)
	start := time.Now()
	b.Publish("delay.small.big", data, nats.Header{"Delay-Level": {"1"}, "Nats-Msg-Id": {"user-big"}, "X-User": {"kept"}})
	itest.WaitFor(t, 15*time.Second, "the refused message in DELAYD_DLQ", func() bool { return b.StreamCount(deliver.DLQStream) >= 1 })
	t.Logf("dead-lettered %s after publish", time.Since(start))

	dlq := b.StreamMsgs(deliver.DLQStream)
	if len(dlq) != 1 {
		t.Fatalf("DELAYD_DLQ holds %d messages, want 1", len(dlq))
	}
	m := dlq[0]
	if want := contract.DLQSubjectPrefix + deliver.ReasonUndeliverable; m.Subject != want {
		t.Errorf("dead-letter subject = %q, want %q", m.Subject, want)
	}
	if got := m.Header.Get(contract.HeaderMsgID); got != "user-big" {
		t.Errorf("%s = %q, want %q; headers %v", contract.HeaderMsgID, got, "user-big", m.Header)
	}
	if !bytes.Equal(m.Data, data) {
		t.Errorf("payload changed: %d bytes, want the %d published", len(m.Data), len(data))
	}
	if got := m.Header.Get("X-User"); got != "kept" {
		t.Errorf("X-User = %q, want %q", got, "kept")
	}
	if reason := m.Header.Get(contract.HeaderError); reason == "" {
		t.Errorf("%s missing", contract.HeaderError)
	} else {
		t.Logf("%s: %s", contract.HeaderError, reason)
	}
	if n := b.StreamCount("SMALL"); n != 0 {
		t.Errorf("SMALL holds %d messages, want 0", n)
	}
	// Counted once the dead letter's PubAck is back, which may trail its
	// arrival in DELAYD_DLQ: wait for the count, then check it is one.
	itest.WaitFor(t, 10*time.Second, "DELAYD_100MS's dead-letter count", func() bool {
		return b.ScannerStats("DELAYD_100MS").DeadLettered >= 1
	})
	st := b.ScannerStats("DELAYD_100MS")
	t.Logf("scanner %s: retries=%d dead-lettered=%d", st.Stream, st.Retries, st.DeadLettered)
	if st.DeadLettered != 1 {
		t.Errorf("scanner %s dead-lettered %d, want 1", st.Stream, st.DeadLettered)
	}
}
