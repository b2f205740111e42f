package deliver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/resource"
	"github.com/delayd/delayd/levels"
)

// ingressCfg is the ingress partition tests' configuration: the partition
// tests' table, n ingress partitions, level partitions parts.
func ingressCfg(t testing.TB, n int, parts string) Config {
	return Config{Levels: levels.MustParse(partLevels), Partitions: mustPartitions(t, parts), IngressPartitions: n, LeaseTTL: ownerTTL}
}

// noLevels makes a replica bid for no level lease: what the routers write
// stays in the level streams.
func noLevels(s *Service) {
	s.hooks.noBid = func(key string) bool { return strings.HasPrefix(key, "level.") }
}

// noRouter makes a replica bid for no router lease: ingress keeps what is
// published.
func noRouter(s *Service) {
	s.hooks.noBid = func(key string) bool { return strings.HasPrefix(key, ownership.RouterKey) }
}

// waitRouters waits until every router lease "router.<i>", i < n, is held
// by exactly one of rs.
func waitRouters(t *testing.T, n int, rs ...*replica) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		bad := ""
		for i := range n {
			holders := 0
			for _, r := range rs {
				if r.held()[ownership.RouterPartitionKey(i)] {
					holders++
				}
			}
			if holders != 1 {
				bad = fmt.Sprintf("%s held by %d replicas", ownership.RouterPartitionKey(i), holders)
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %s", bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkNotEarly fails for every TGT message stored before its
// Delay-Due-At.
func (b *ownerBundle) checkNotEarly() {
	b.t.Helper()
	ctx := context.Background()
	tgt, err := b.js.Stream(ctx, "TGT")
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := tgt.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	early := 0
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := tgt.GetMsg(ctx, seq)
		if err != nil {
			b.t.Fatalf("TGT %d: %v", seq, err)
		}
		due, err := time.Parse(time.RFC3339Nano, m.Header.Get("Delay-Due-At"))
		if err != nil || m.Time.Before(due) {
			if early++; early <= 5 {
				b.t.Errorf("%s stored at %s, due %s (%v)", m.Data, m.Time, due, err)
			}
		}
	}
	if early > 0 {
		b.t.Errorf("TGT: %d early", early)
	}
}

// TestIngressPartitions: with 4 ingress partitions and level 500ms in 8
// partitions, two replicas hold the 4 router leases, one each by exactly
// one replica; 800 messages over 40 keys (targets, and Delay-Partition-Key
// on a shared target) are routed with no level lease held, so the level
// streams keep them: every message is in the partition DELAYD_500MS-P<j>
// where j mod 4 is its published subject's ingress partition and j div 4
// its partition key's hash among that router's 2 partitions, and each
// router routed exactly its partition's messages (RouterStats; the stats API
// lists each router of a replica). Then a
// third replica delivers them: each key's messages reach the stream target
// in publish order, none lost, doubled or early.
func TestIngressPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("800 messages through 4 routers in two replicas: skipped under testing.Short()")
	}
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	a := b.launch("A", ingressCfg(t, 4, "500ms=8"), noLevels)
	waitReady(t, a)
	c := b.launch("B", ingressCfg(t, 4, "500ms=8"), noLevels)
	waitReady(t, c)
	waitRouters(t, 4, a, c)
	msgs := keyedLoad(40, 800, 0)
	b.publishKeyed(msgs)
	b.waitRouted()

	want := make([]uint64, 4) // messages by ingress partition
	for _, m := range msgs {
		want[resource.IngressPartitionOf("delay."+m.target, 4)]++
	}
	var got [4]uint64
	for _, r := range []*replica{a, c} {
		for _, st := range r.svc.RouterStats() {
			got[st.IngressPartition] += st.Routed
			if st.Lease != ownership.RouterPartitionKey(st.IngressPartition) {
				t.Errorf("router %d's lease %q", st.IngressPartition, st.Lease)
			}
		}
	}
	for i := range 4 {
		if want[i] == 0 {
			t.Fatalf("no message of the load in ingress partition %d: the load does not cover every router", i)
		}
		if got[i] != want[i] {
			t.Errorf("router %d routed %d messages, want %d (its partition's)", i, got[i], want[i])
		}
	}
	// The stats API lists each router of a replica: its partition, lease
	// and counters.
	stop, err := a.svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stop() }()
	resp, err := a.nc.Request(contract.StatsSubject, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply StatsReply
	if err := json.Unmarshal(resp.Data, &reply); err != nil {
		t.Fatal(err)
	}
	if len(reply.Routers) != 4 {
		t.Fatalf("A's stats reply lists %d routers, want 4", len(reply.Routers))
	}
	var sum uint64
	for i, r := range reply.Routers {
		sum += r.Routed
		if r.IngressPartition != i || r.Lease != ownership.RouterPartitionKey(i) {
			t.Errorf("A's router %d in the stats reply: %+v", i, r)
		}
	}
	if sum != reply.Routed || sum == 0 {
		t.Errorf("A's routers routed %d in all, its reply's routed is %d", sum, reply.Routed)
	}

	stored := 0
	d := 500 * time.Millisecond
	for j := range 8 {
		stream := levels.PartitionStreamName(d, j)
		prefix := levelSubjects + strings.TrimPrefix(stream, levels.StreamPrefix) + "."
		for _, m := range b.levelMsgs(stream) {
			stored++
			target := strings.TrimPrefix(m.Subject, prefix)
			key, _, _ := strings.Cut(string(m.Data), "|") // the payload names the partition key

			i := resource.IngressPartitionOf("delay."+target, 4)
			if wantJ := i + 4*levels.PartitionOf(key, 2); j != wantJ {
				t.Errorf("%s (target %s, key %s, ingress partition %d) in %s, want partition %d", m.Data, target, key, i, stream, wantJ)
			}
		}
	}
	if stored != len(msgs) {
		t.Errorf("the 500ms partitions hold %d messages, want %d", stored, len(msgs))
	}
	a.stopGracefully(t)
	c.stopGracefully(t)
	b.launch("C", ingressCfg(t, 4, "500ms=8"))
	b.checkKeyOrder(msgs)
	b.checkNotEarly()
}

// TestIngressPartitionsMismatch: a replica whose DELAYD_INGRESS_PARTITIONS
// differs from a live one's refuses to start, naming the variable.
func TestIngressPartitionsMismatch(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	waitReady(t, b.launch("A", ingressCfg(t, 1, "")))
	c := b.launch("B", ingressCfg(t, 4, ""))
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Fatal("B, with 4 ingress partitions, did not stop while A runs with 1")
	}
	if !errors.Is(c.err, ErrReplicaMismatch) || !strings.Contains(fmt.Sprint(c.err), "DELAYD_INGRESS_PARTITIONS") {
		t.Fatalf("B's error: %v; want ErrReplicaMismatch naming DELAYD_INGRESS_PARTITIONS", c.err)
	}
}

// TestNewRejectsIngressPartitions: a level count that is not a multiple of
// the ingress partitions, or an ingress count above 64, is refused by New (a multiple passes: TestIngressPartitions).
func TestNewRejectsIngressPartitions(t *testing.T) {
	t.Parallel()
	if _, err := New(nil, ingressCfg(t, 4, "500ms=6")); !errors.Is(err, levels.ErrBadPartitions) {
		t.Errorf("New with 500ms=6 and 4 ingress partitions: %v; want levels.ErrBadPartitions", err)
	}
	if _, err := New(nil, ingressCfg(t, 65, "")); err == nil {
		t.Error("New with 65 ingress partitions: no error")
	}
}

// ingressTransformOf returns DELAYD_INGRESS's subject transform
// destination, "" for none, and its message count.
func (b *ownerBundle) ingressState() (string, uint64) {
	b.t.Helper()
	s, err := b.js.Stream(context.Background(), IngressStream)
	if err != nil {
		b.t.Fatal(err)
	}
	info := s.CachedInfo()
	dest := ""
	if info.Config.SubjectTransform != nil {
		dest = info.Config.SubjectTransform.Destination
	}
	return dest, info.State.Msgs
}

// publishPlain publishes one message per payload to "delay.<target>" with
// Delay-Level 2 (500ms).
func (b *ownerBundle) publishPlain(target string, payloads ...string) {
	b.t.Helper()
	for _, p := range payloads {
		if _, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: "delay." + target,
			Header: nats.Header{contract.HeaderLevel: {"2"}}, Data: []byte(p)}); err != nil {
			b.t.Fatal(err)
		}
	}
}

// TestIngressPartitionsChange: a replica started with another ingress
// partition count while DELAYD_INGRESS holds messages stored under the
// old one refuses to start (ErrIngressPartitionsChanged, naming
// DELAYD_INGRESS_PARTITIONS) and changes nothing: the stream keeps its
// transform and its messages. Started with the old count, delayd routes
// them; once the stream is empty, the new count is taken: 1 -> 4 sets the
// transform, 4 -> 1 removes it, and at every step the messages published
// reach the target, each key's in publish order, none lost, doubled or
// early (the level streams' partition change keeps the order across it).
// Level 500ms has 4 partitions throughout, so the new routers find in them
// the epoch markers of lease "router" (of epoch 3, written last by C2),
// whose epochs are not theirs: no router is fenced by them.
func TestIngressPartitionsChange(t *testing.T) {
	if testing.Short() {
		t.Skip("five starts of delayd: skipped under testing.Short()")
	}
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	var all []keyedMsg
	run := func(name string, n int, first int) {
		r := b.launch(name, ingressCfg(t, n, "500ms=4"))
		waitReady(t, r)
		msgs := keyedLoad(24, 240, first)
		b.publishKeyed(msgs)
		all = append(all, msgs...)
		b.checkKeyOrder(all)
		for _, st := range r.svc.RouterStats() {
			if len(st.FencedWrites) > 0 {
				t.Errorf("%s: router %d (%s) fenced by another router's markers: %v", name, st.IngressPartition, st.Lease, st.FencedWrites)
			}
		}
		r.stopGracefully(t)
	}
	run("A", 1, 0)

	// Messages left in ingress by a replica with 1 that routes nothing.
	idle := b.launch("idle", ingressCfg(t, 1, "500ms=4"), noRouter)
	waitReady(t, idle)
	held := keyedLoad(24, 48, 1000)
	b.publishKeyed(held)
	idle.stopGracefully(t)
	all = append(all, held...)

	refused := b.launch("B", ingressCfg(t, 4, "500ms=4"))
	select {
	case <-refused.done:
	case <-time.After(30 * time.Second):
		t.Fatal("B, with 4 ingress partitions, did not stop while DELAYD_INGRESS holds messages stored for 1")
	}
	if !errors.Is(refused.err, ErrIngressPartitionsChanged) || !strings.Contains(fmt.Sprint(refused.err), "DELAYD_INGRESS_PARTITIONS") {
		t.Fatalf("B's error: %v; want ErrIngressPartitionsChanged naming DELAYD_INGRESS_PARTITIONS", refused.err)
	}
	if dest, n := b.ingressState(); dest != "" || n != uint64(len(held)) {
		t.Fatalf("after B's refusal DELAYD_INGRESS has transform %q and %d messages; want none and %d", dest, n, len(held))
	}

	run("C", 1, 2000) // routes the held messages, then its own
	// A router term that writes its epoch markers and nothing after them:
	// each level stream's last message is a marker of lease "router" with
	// a higher epoch than the new routers' first terms.
	marks := b.launch("C2", ingressCfg(t, 1, "500ms=4"))
	waitReady(t, marks)
	b.waitRouterConsumer(marks)
	marks.stopGracefully(t)
	run("D", 4, 3000)
	if dest, _ := b.ingressState(); dest != "delayd.in.{{partition(4)}}.>" {
		t.Fatalf("with 4 ingress partitions DELAYD_INGRESS's transform is %q", dest)
	}
	run("E", 1, 4000)
	if dest, _ := b.ingressState(); dest != "" {
		t.Fatalf("back to 1 ingress partition DELAYD_INGRESS's transform is %q", dest)
	}
	b.checkNotEarly()
}

// waitRouterConsumer waits until r routes (one ingress partition) and
// DELAYD_INGRESS has its term's consumer: the term wrote its epoch markers
// before creating it.
func (b *ownerBundle) waitRouterConsumer(r *replica) {
	b.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for {
		if st := r.svc.RouterStats(); len(st) == 1 && st[0].Owner {
			if _, err := b.js.Consumer(ctx, IngressStream, RouterConsumerName(st[0].Epoch)); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatal("no router consumer on DELAYD_INGRESS after a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIngressPartitionsChangeRace: messages a publisher stores while the
// first replica with a new ingress partition count is between its check
// that DELAYD_INGRESS is empty and its update of the transform are stored
// under the old count's subjects; the replica publishes them again under
// the new one, so they are routed and delivered (each target's in publish
// order, none lost, doubled or early) and DELAYD_INGRESS ends empty. Both
// ways: 1 -> 4 and 4 -> 1.
func TestIngressPartitionsChangeRace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		from, to int
	}{{"1to4", 1, 4}, {"4to1", 4, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupOwners(t)
			b.targetStream()
			old := b.launch("A", ingressCfg(t, tc.from, ""))
			waitReady(t, old)
			old.stopGracefully(t)
			race := keyedLoad(8, 40, 0)
			cur := b.launch("B", ingressCfg(t, tc.to, ""), func(s *Service) {
				s.hooks.ingressChanging = func() { b.publishKeyed(race) }
			})
			waitReady(t, cur)
			b.checkKeyOrder(race)
			b.checkNotEarly()
			b.waitRouted()
		})
	}
}
