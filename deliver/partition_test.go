package deliver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/levels"
)

// partLevels is the partition tests' level table; level 2 (500ms) is the
// one partitioned.
const partLevels = "200ms 500ms 1s"

func mustPartitions(t testing.TB, text string) levels.Partitions {
	t.Helper()
	p, err := levels.ParsePartitions(text)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startParts starts a replica with the partition tests' table and
// partition list parts, bidding for no lease in skip, and waits until it
// is ready.
func (b *ownerBundle) startParts(name, parts string, skip ...string) *replica {
	b.t.Helper()
	return b.startPartsTable(name, partLevels, parts, skip...)
}

// startPartsTable is [ownerBundle.startParts] with the level table table.
func (b *ownerBundle) startPartsTable(name, table, parts string, skip ...string) *replica {
	b.t.Helper()
	cfg := Config{Levels: levels.MustParse(table), Partitions: mustPartitions(b.t, parts), LeaseTTL: ownerTTL}
	r := b.launch(name, cfg, func(s *Service) {
		if len(skip) > 0 {
			s.hooks.noBid = func(key string) bool { return slices.Contains(skip, key) }
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !r.svc.Ready() {
		select {
		case <-r.done:
			b.t.Fatalf("replica %s stopped: %v", name, r.err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("replica %s not ready: %v", name, r.svc.Unready())
		}
	}
	return r
}

// keyedMsg is one message of the keyed load: its key (the partition key,
// or its target subject when header is false), its target subject and its
// number in the key's publish order.
type keyedMsg struct {
	key, target string
	header      bool
	n           int
}

// keyedLoad returns count messages over keys keys, numbered per key in
// publish order: key k targets "tgt.k<k>", and every third key names its
// partition key in Delay-Partition-Key ("pk-<k>") instead, sharing target
// "tgt.shared" with the other keyed ones.
func keyedLoad(keys, count, first int) []keyedMsg {
	var out []keyedMsg
	for i := range count {
		k := i % keys
		m := keyedMsg{key: "tgt.k" + strconv.Itoa(k), target: "tgt.k" + strconv.Itoa(k), n: first + i/keys}
		if k%3 == 0 {
			m.key, m.target, m.header = "pk-"+strconv.Itoa(k), "tgt.shared", true
		}
		out = append(out, m)
	}
	return out
}

// payload is a keyed message's payload: "<key>|<n>".
func (m keyedMsg) payload() string { return m.key + "|" + strconv.Itoa(m.n) }

// publishKeyed publishes msgs in order with Delay-Level 2 (500ms) from
// one connection, asynchronously in batches of 200 whose PubAcks are
// awaited: the ingress stream stores them in publish order, and a batch's
// messages fall due within moments of each other, so any two of one key
// in different streams would race.
func (b *ownerBundle) publishKeyed(msgs []keyedMsg) {
	b.t.Helper()
	for i := 0; i < len(msgs); {
		var futs []jetstream.PubAckFuture
		for end := min(i+200, len(msgs)); i < end; i++ {
			m := msgs[i]
			h := nats.Header{contract.HeaderLevel: {"2"}}
			if m.header {
				h[contract.HeaderPartitionKey] = []string{m.key}
			}
			f, err := b.js.PublishMsgAsync(&nats.Msg{Subject: "delay." + m.target, Header: h, Data: []byte(m.payload())})
			if err != nil {
				b.t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.t.Fatalf("publish %s: %v", f.Msg().Data, err)
			}
		}
	}
}

// waitRouted waits until the ingress stream is empty: every message
// published so far is in a level stream (or delivered).
func (b *ownerBundle) waitRouted() {
	b.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := b.js.Stream(context.Background(), IngressStream)
		if err == nil && info.CachedInfo().State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("ingress not empty after a minute (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// levelMsgs returns the messages of a level stream, epoch markers left out.
func (b *ownerBundle) levelMsgs(stream string) []*jetstream.RawStreamMsg {
	b.t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		b.t.Fatalf("stream %s: %v", stream, err)
	}
	st := s.CachedInfo().State
	var out []*jetstream.RawStreamMsg
	for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // purged or deleted
		}
		if !message.IsMarker(m.Subject) {
			out = append(out, m)
		}
	}
	return out
}

// checkKeyOrder waits until TGT holds want messages, then checks that
// every payload of msgs is there exactly once, without a partition key
// header, and that each key's payloads are stored in publish order.
func (b *ownerBundle) checkKeyOrder(msgs []keyedMsg) {
	b.t.Helper()
	ctx := context.Background()
	tgt, err := b.js.Stream(ctx, "TGT")
	if err != nil {
		b.t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := tgt.Info(ctx)
		if err == nil && info.State.Msgs >= uint64(len(msgs)) {
			break
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("TGT holds %d of %d messages after 2 minutes (%v)", info.State.Msgs, len(msgs), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive meanwhile
	info, err := tgt.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	seen := map[string]int{}
	last := map[string]int{}
	inversions := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := tgt.GetMsg(ctx, seq)
		if err != nil {
			b.t.Fatalf("TGT %d: %v", seq, err)
		}
		if v := m.Header.Get(contract.HeaderPartitionKey); v != "" {
			b.t.Errorf("TGT %d carries %s %q: a control header must not be delivered", seq, contract.HeaderPartitionKey, v)
		}
		key, nText, _ := strings.Cut(string(m.Data), "|")
		n, _ := strconv.Atoi(nText)
		seen[string(m.Data)]++
		if prev, ok := last[key]; ok && n < prev {
			inversions++
			if inversions <= 5 {
				b.t.Errorf("key %s: %d stored after %d: out of publish order", key, n, prev)
			}
		}
		last[key] = max(last[key], n)
	}
	lost, dups := 0, 0
	for _, m := range msgs {
		switch c := seen[m.payload()]; {
		case c == 0:
			lost++
		case c > 1:
			dups += c - 1
		}
	}
	if lost > 0 || dups > 0 || inversions > 0 {
		b.t.Errorf("TGT: %d of %d lost, %d duplicates, %d out of key order", lost, len(msgs), dups, inversions)
	}
}

// TestPartitionRouting: with level 500ms in 4 partitions and no replica
// delivering them (their leases left alone), 600 messages over 30 keys,
// and 10 cascading messages (Delay-Duration 9.9s: 5s, then a hop on to
// 500ms) with a Delay-Partition-Key each, land in the partition streams
// DELAYD_500MS-P0..P3, each key's in exactly one, the one
// levels.PartitionOf(key, 4) names (the key is the Delay-Partition-Key if
// set, else the target subject; a hop keeps it), and the keys are spread
// over every partition. No unpartitioned DELAYD_500MS is created.
//
// A hop's level is chosen by what remains when its forward is stored
// (classifier.cascadeLevel): the 9.9 s message leaves 5s with 4.9 s to
// go, and lands at 500ms only if its forward is stored less than 4.4 s
// after its wait at 5s ended; later, it rightly moves on through shorter
// levels and never reaches a partition. The table's 5s (not 1s, with
// 1.6 s: a margin of 100 ms, which a busy machine's scanner missed about
// one run in two) gives that margin. The hops' target is bound to a
// stream, so a hop that missed it is seen delivered there and named,
// instead of the count falling short for a minute.
func TestPartitionRouting(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	d := 500 * time.Millisecond
	var skip []string
	for i := range 4 {
		skip = append(skip, ownership.LevelKey(levels.PartitionStreamName(d, i)))
	}
	const (
		table      = "200ms 500ms 5s"
		cascade    = 9900 * time.Millisecond
		firstLevel = 5 * time.Second
	)
	b.startPartsTable("A", table, "500ms=4", skip...)
	msgs := keyedLoad(30, 600, 0)
	b.publishKeyed(msgs)
	// Cascading messages: 9.9s waits at 5s, then hops on to 500ms, where
	// its Delay-Partition-Key, kept across the hop, picks the partition.
	ctx := context.Background()
	for i := range 10 {
		key := "hop-" + strconv.Itoa(i)
		h := nats.Header{contract.HeaderDuration: {cascade.String()}, contract.HeaderPartitionKey: {key}}
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "delay.tgt.hop", Header: h, Data: []byte(key + "|0")}); err != nil {
			t.Fatal(err)
		}
	}
	want := len(msgs) + 10

	var where map[string]map[int]int // key -> partition -> messages
	total := 0
	var hopLate time.Duration // the latest hop's forward, after its wait at 5s ended
	for deadline := time.Now().Add(time.Minute); total != want; {
		if time.Now().After(deadline) {
			t.Fatalf("the partitions hold %d messages after a minute, want %d", total, want)
		}
		time.Sleep(50 * time.Millisecond)
		if missed := b.targetPayloads(); len(missed) > 0 {
			t.Fatalf("cascading messages %v moved on through the levels below 500ms: their forward from 5s came "+
				"%s or more after its wait ended (a machine too busy for this test), or the hop lost its level", missed,
				cascade-firstLevel-d)
		}
		where, total = map[string]map[int]int{}, 0
		for i := range 4 {
			for _, m := range b.levelMsgs(levels.PartitionStreamName(d, i)) {
				key, _, _ := strings.Cut(string(m.Data), "|")
				if where[key] == nil {
					where[key] = map[int]int{}
				}
				where[key][i]++
				total++
				if strings.HasPrefix(key, "hop-") {
					hopLate = max(hopLate, forwardLateness(t, m, firstLevel, d))
				}
			}
		}
	}
	t.Logf("the hops' forwards were stored up to %s after their wait at 5s ended", hopLate)
	used := map[int]bool{}
	for key, parts := range where {
		want := levels.PartitionOf(key, 4)
		if len(parts) != 1 || parts[want] == 0 {
			t.Errorf("key %s is in partitions %v, want only %d", key, parts, want)
		}
		used[want] = true
	}
	if len(where) != 40 || len(used) != 4 {
		t.Errorf("%d keys over partitions %v: want 40 keys (30, and 10 hops) over all 4", len(where), used)
	}
	if _, err := b.js.Stream(ctx, levels.StreamName(d)); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("DELAYD_500MS exists (or: %v): a partitioned level has only its partition streams", err)
	}
}

// forwardLateness returns how long after its wait at its first level
// (first, from Delay-Enqueued-At) the hop of level message m, placed at
// level delay, was stored by the ingress stream: Delayd-Hop-Due is that
// store time + delay.
func forwardLateness(t testing.TB, m *jetstream.RawStreamMsg, first, delay time.Duration) time.Duration {
	t.Helper()
	enqueued, err := message.ParseTime(m.Header.Get(contract.HeaderEnqueuedAt))
	if err != nil {
		t.Fatalf("%s: %s: %v", m.Data, contract.HeaderEnqueuedAt, err)
	}
	hopDue, err := message.ParseTime(m.Header.Get(message.HdrHopDue))
	if err != nil {
		t.Fatalf("%s: %s %q: %v", m.Data, message.HdrHopDue, m.Header.Get(message.HdrHopDue), err)
	}
	return hopDue.Add(-delay).Sub(enqueued.Add(first))
}

// TestPartitionKeyOrder: 1,500 messages over 40 keys to a stream target,
// level 500ms in 4 partitions delivered by two replicas: every message is
// stored once, without its Delay-Partition-Key, and each key's messages
// in publish order.
func TestPartitionKeyOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("1,500 messages through two replicas: skipped under testing.Short()")
	}
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	b.startParts("A", "500ms=4")
	b.startParts("B", "500ms=4")
	msgs := keyedLoad(40, 1500, 0)
	b.publishKeyed(msgs)
	b.checkKeyOrder(msgs)
}

// TestPartitionChangeOrder: messages routed under one partition count
// wait in a stream that is drained late (its lease held by no replica for
// a while: a lagging drain), then delayd restarts with another count and
// more messages are published for the same keys. The new messages wait
// for the old ones: at the stream target each key's messages are in
// publish order, none lost or doubled. Both ways: 1 -> 4 and 4 -> 1.
func TestPartitionChangeOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("two restarts and a held drain: skipped under testing.Short()")
	}
	d := 500 * time.Millisecond
	unpartitioned := []string{levels.StreamName(d)}
	var partitions []string
	for i := range 4 {
		partitions = append(partitions, levels.PartitionStreamName(d, i))
	}
	for _, tc := range []struct {
		name     string
		from, to string
		retired  []string // the streams of the old count, drained late
	}{
		{"1to4", "", "500ms=4", unpartitioned},
		{"4to1", "500ms=4", "", partitions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupOwners(t)
			b.targetStream()
			var skip []string
			for _, s := range tc.retired {
				skip = append(skip, ownership.LevelKey(s))
			}
			old := b.startParts("A", tc.from, skip...)
			first := keyedLoad(24, 240, 0)
			b.publishKeyed(first)
			b.waitRouted()
			old.stopGracefully(t)

			// The new count; the old streams' leases still taken by no one.
			cur := b.startParts("B", tc.to, skip...)
			second := keyedLoad(24, 240, 1000)
			b.publishKeyed(second)
			b.waitRouted()
			// Long enough for every new message to fall due (500ms) and,
			// without the order gate, be delivered ahead of the old ones.
			time.Sleep(2 * time.Second)
			held := 0
			for _, s := range tc.retired {
				held += len(b.levelMsgs(s))
			}
			if held != len(first) {
				t.Fatalf("the old streams hold %d messages before their drain, want %d", held, len(first))
			}
			// The drain: a replica that bids for the old streams too.
			b.startParts("C", tc.to)
			b.checkKeyOrder(append(first, second...))
			_ = cur
		})
	}
}

// TestPartitionLeasesShared: two replicas share a partitioned level's
// leases: with levels "2ms 4ms" and 4ms in 16 partitions there are 21
// leases (the router, the janitor, DELAYD_0S, DELAYD_1MS, DELAYD_2MS and
// the 16 partitions), so each replica's share is 11 and it holds 10 or 11
// once balanced, at least 5 of them partitions. Each partition lease is
// held by exactly one replica, and each replica holds at least 5.
func TestPartitionLeasesShared(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	cfg := Config{Levels: levels.MustParse("2ms 4ms"), Partitions: mustPartitions(t, "4ms=16"), LeaseTTL: ownerTTL}
	a := b.launch("A", cfg)
	waitReady(t, a)
	c := b.launch("B", cfg)
	waitReady(t, c)
	var keys []string
	for i := range 16 {
		keys = append(keys, ownership.LevelKey(levels.PartitionStreamName(4*time.Millisecond, i)))
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ha, hc := a.held(), c.held()
		na, nc, bad := 0, 0, ""
		for _, k := range keys {
			switch {
			case ha[k] && hc[k]:
				bad = k + " held by both"
			case ha[k]:
				na++
			case hc[k]:
				nc++
			default:
				bad = k + " held by neither"
			}
		}
		if bad == "" && na >= 5 && nc >= 5 {
			t.Logf("partition leases: A holds %d, B holds %d", na, nc)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: A holds %d partition leases, B %d (%s)", na, nc, bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkNoOverlap(t, a, c)
}

// TestPartitionsMismatch: a replica whose DELAYD_PARTITIONS differs from a
// live one's refuses to start, naming the variable, and creates no
// stream.
func TestPartitionsMismatch(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.startParts("A", "")
	c := b.launch("B", Config{Levels: levels.MustParse(partLevels), Partitions: mustPartitions(t, "500ms=2"), LeaseTTL: ownerTTL})
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Fatal("B, with other partitions, did not stop while A runs")
	}
	if !errors.Is(c.err, ErrReplicaMismatch) || !strings.Contains(fmt.Sprint(c.err), "DELAYD_PARTITIONS") {
		t.Fatalf("B's error: %v; want ErrReplicaMismatch naming DELAYD_PARTITIONS", c.err)
	}
	if _, err := b.js.Stream(context.Background(), "DELAYD_500MS-P0"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("B refused to start, yet DELAYD_500MS-P0 exists (or: %v)", err)
	}
}

// TestNewRejectsPartitionsOutsideTable: a Service whose partitions name a
// delay that is not a level of its table is refused by New.
func TestNewRejectsPartitionsOutsideTable(t *testing.T) {
	_, err := New(nil, Config{Levels: levels.MustParse(partLevels), Partitions: mustPartitions(t, "2s=4")})
	if !errors.Is(err, levels.ErrBadPartitions) {
		t.Fatalf("New: %v; want levels.ErrBadPartitions", err)
	}
}

// TestPartitionChangeOldMarkersOnly: a change of partition count when the
// old stream holds nothing but a router's epoch marker (or only messages
// already delivered) holds nothing back: the new messages are delivered.
func TestPartitionChangeOldMarkersOnly(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	old := b.startParts("A", "")
	for deadline := time.Now().Add(30 * time.Second); len(b.levelMsgs(levels.StreamName(500*time.Millisecond))) > 0 ||
		!old.svc.Ready(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("A not ready in 30 s")
		}
	}
	st, err := b.js.Stream(context.Background(), levels.StreamName(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); st.CachedInfo().State.Msgs == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the router's epoch marker is not in DELAYD_500MS after 30 s")
		}
		time.Sleep(20 * time.Millisecond)
		if st, err = b.js.Stream(context.Background(), levels.StreamName(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	old.stopGracefully(t)
	b.startParts("B", "500ms=4")
	msgs := keyedLoad(10, 100, 0)
	b.publishKeyed(msgs)
	b.checkKeyOrder(msgs)
}

// TestPartitionCancel: on a level in 4 partitions shared by two replicas,
// a cancel by id of each of 12 pending messages (12 targets, so spread
// over the partitions) is answered "cancelled" through the partition
// owner's decide subject, and none of them is delivered, while 12
// messages published after them, not cancelled, are. The level is 10 s
// long, so that every cancel is asked while its message is pending: with
// a 1 s level, on a busy machine, the later cancels came after their
// messages were due and were rightly answered "already delivered".
func TestPartitionCancel(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	const table = "200ms 500ms 10s"
	b.startPartsTable("A", table, "10s=4")
	b.startPartsTable("B", table, "10s=4")
	for i := range 12 {
		target := "tgt.c" + strconv.Itoa(i)
		b.publishTo(target, "cancel-me-"+strconv.Itoa(i), nats.Header{contract.HeaderLevel: {"3"}, contract.HeaderNatsMsgID: {"c-" + strconv.Itoa(i)}})
	}
	for i := range 12 {
		target := "tgt.c" + strconv.Itoa(i)
		m, err := b.nc.Request(contract.CancelSubjectFor(target), []byte("c-"+strconv.Itoa(i)), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != contract.CancelReplyCancelled {
			t.Errorf("cancel of c-%d (target %s): %q, want %q", i, target, m.Data, contract.CancelReplyCancelled)
		}
	}
	for i := range 12 {
		b.publishTo("tgt.c"+strconv.Itoa(i), "keep-"+strconv.Itoa(i), nats.Header{contract.HeaderLevel: {"3"}})
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got := b.targetPayloads()
		kept := 0
		for _, p := range got {
			if strings.HasPrefix(p, "cancel-me-") {
				t.Fatalf("cancelled message %s delivered", p)
			}
			kept++
		}
		if kept == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TGT holds %d of the 12 messages not cancelled after a minute", kept)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
