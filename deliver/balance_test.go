package deliver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
)

// balanced returns nil once every lease is held by exactly one of rs, each
// of rs counts len(rs) live replicas, and each holds its share,
// ceil(leases / len(rs)), or one fewer (none holds more: the hand-overs
// are done); otherwise what is not so.
func balanced(rs ...*replica) error {
	keys := leaseKeys()
	share := (len(keys) + len(rs) - 1) / len(rs)
	holders := map[string][]string{}
	for _, r := range rs {
		h := r.held()
		for k := range h {
			holders[k] = append(holders[k], r.name)
		}
		if live, _, _ := r.svc.Balance(); live != len(rs) {
			return fmt.Errorf("%s counts %d live replicas, want %d", r.name, live, len(rs))
		}
		if len(h) < share-1 || len(h) > share {
			return fmt.Errorf("%s holds %d leases, want ceil(%d/%d) = %d or one fewer", r.name, len(h), len(keys), len(rs), share)
		}
	}
	for _, k := range keys {
		if len(holders[k]) != 1 {
			return fmt.Errorf("%s held by %v, want exactly one replica", k, holders[k])
		}
	}
	return nil
}

// waitBalanced waits (two minutes at most) until [balanced] holds for rs.
// With [ownerTTL] the last hand-overs wait for the leases to settle (no
// change of live replicas for a TTL, 15 s): a join takes about 30 s.
func (b *ownerBundle) waitBalanced(rs ...*replica) {
	b.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := balanced(rs...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("not balanced after two minutes: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkHandedOver checks that key went from `from` to `to` by a release:
// from's last term of key ended Resigned or HandedOver (not Lost), and to
// gained it after that term ended and before its fence would have passed
// (no TTL wait).
func checkHandedOver(t *testing.T, from, to *replica, key string) {
	t.Helper()
	var last *ownership.Event
	for _, ev := range from.eventsCopy() {
		if ev.Key == key && ev.Kind != ownership.Gained {
			last = &ev
		}
	}
	if last == nil {
		t.Errorf("%s: %s never gave it up", key, from.name)
		return
	}
	if last.Kind == ownership.Lost {
		t.Errorf("%s: %s lost it (%v), want a release", key, from.name, last.Cause)
		return
	}
	for _, ev := range to.eventsCopy() {
		if ev.Key == key && ev.Kind == ownership.Gained && ev.Acquired.After(last.ValidUntil) {
			if !ev.Acquired.Before(last.Fence) {
				t.Errorf("%s: %s gained it %s after %s's fence: it waited for the TTL, no hand-over", key, to.name,
					ev.Acquired.Sub(last.Fence), from.name)
			}
			return
		}
	}
	t.Errorf("%s: %s did not gain it after %s %s it", key, to.name, from.name, last.Kind)
}

// noneLost fails the test for every Lost event of rs.
func noneLost(t *testing.T, rs ...*replica) {
	t.Helper()
	for _, r := range rs {
		for _, ev := range r.eventsCopy() {
			if ev.Kind == ownership.Lost {
				t.Errorf("%s lost %s (epoch %d): %v", r.name, ev.Key, ev.Epoch, ev.Cause)
			}
		}
	}
}

// holderOf returns which of rs holds key now, or nil.
func holderOf(key string, rs ...*replica) *replica {
	for _, r := range rs {
		if r.held()[key] {
			return r
		}
	}
	return nil
}

// startBalanced starts n replicas with lease TTL ttl, one after the
// other, and waits until they share the leases.
//
// The balance tests that use it are not parallel: they run before the
// package's parallel tests, alone. Their "no hand-over" assertions need
// each replica to bid within 2T of a lease falling free; under -race,
// among the parallel tests, a starved replica left one free that long and
// another took it beyond its share (liveness before balance, by design),
// then handed it on.
func (b *ownerBundle) startBalanced(n int, ttl time.Duration) []*replica {
	b.t.Helper()
	var rs []*replica
	for i := range n {
		rs = append(rs, b.start(fmt.Sprintf("R%d", i), ttl))
	}
	b.waitBalanced(rs...)
	return rs
}

// TestBalanceSpread: three replicas started one after the other share the
// leases: each holds within 1 of ceil(leases/3), every lease is held by
// exactly one, and once spread nothing moves for 4.5 s (three default
// TTLs: no flapping). The first one took every lease alone and handed the
// surplus over: no replica lost a lease. The TTL is [ownerTTL], so that
// a renewal stalled under -race does not expire a lease.
func TestBalanceSpread(t *testing.T) {
	// Not parallel (see startBalanced).
	b := setupOwners(t)
	rs := b.startBalanced(3, ownerTTL)
	before := map[string]string{}
	for _, k := range leaseKeys() {
		before[k] = holderOf(k, rs...).name
	}
	for end := time.Now().Add(3 * lease.TTLDefault); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, k := range leaseKeys() {
			if h := holderOf(k, rs...); h == nil || h.name != before[k] {
				t.Fatalf("%s moved from %s while three replicas ran at their shares", k, before[k])
			}
		}
	}
	noneLost(t, rs...)
	checkNoOverlap(t, rs...)
	for _, r := range rs {
		live, share, held := r.svc.Balance()
		t.Logf("%s: live %d, share %d, holds %d", r.name, live, share, held)
	}
}

// TestBalanceGracefulStop: of three replicas sharing the leases, one
// stops gracefully; the other two take each of its leases by its release,
// before its fence (no TTL wait), each no more than its share (no
// hand-over between them), and no replica loses a lease. The TTL is
// [ownerTTL]: every lease changes hands by a release, none may expire.
func TestBalanceGracefulStop(t *testing.T) {
	// Not parallel (see startBalanced).
	b := setupOwners(t)
	rs := b.startBalanced(3, ownerTTL)
	gone := rs[0].held()
	stopped := time.Now()
	rs[0].stopGracefully(t)
	b.waitBalanced(rs[1:]...)
	for _, k := range slices.Sorted(maps.Keys(gone)) {
		checkHandedOver(t, rs[0], holderOf(k, rs[1:]...), k)
	}
	// Each took no more than its share: neither hands a lease on.
	for _, r := range rs[1:] {
		for _, ev := range r.eventsCopy() {
			if ev.Kind == ownership.HandedOver && ev.ValidUntil.After(stopped) {
				t.Errorf("%s handed %s over after R0's stop: it took more than its share", r.name, ev.Key)
			}
		}
	}
	noneLost(t, rs...)
	checkNoOverlap(t, rs...)
}

// TestBalanceKilled: of three replicas sharing the leases, one is killed
// (its connection closed: no renewal, no release, its membership key
// left); the other two count it out and take each of its leases, each only
// after its term's fence, and no more than its share (no hand-over
// between them).
func TestBalanceKilled(t *testing.T) {
	// Not parallel (see startBalanced).
	b := setupOwners(t)
	rs := b.startBalanced(3, expiryTTL) // the default: expiry is the subject
	crashed := rs[0].held()
	killed := time.Now()
	rs[0].nc.Close()
	b.waitBalanced(rs[1:]...)
	// Each took no more than its share: neither hands a lease on.
	for _, r := range rs[1:] {
		for _, ev := range r.eventsCopy() {
			if ev.Kind == ownership.HandedOver && ev.ValidUntil.After(killed) {
				t.Errorf("%s handed %s over after R0 was killed: it took more than its share", r.name, ev.Key)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(crashed)) {
		lost := rs[0].waitEvent(t, k, ownership.Lost, time.Minute)
		if !errors.Is(lost.Cause, lease.ErrExpired) {
			t.Errorf("%s: R0's term ended by %v, want its expiry", k, lost.Cause)
		}
		next := holderOf(k, rs[1:]...)
		gained := next.waitEvent(t, k, ownership.Gained, time.Second)
		if !gained.Acquired.After(lost.ValidUntil) {
			t.Errorf("%s: %s gained it %s before R0's term ended at its fence", k, next.name, lost.ValidUntil.Sub(gained.Acquired))
		}
	}
	noneLost(t, rs[1:]...)
	checkNoOverlap(t, rs...)
}

// TestBalanceJoin: a fourth replica joining three that share the leases
// gets its share by hand-over: the others release their surplus one lease
// at a time, and it gains each before the releasing term's fence; no
// replica loses a lease. The TTL is [ownerTTL]: every lease changes
// hands by a release, none may expire.
func TestBalanceJoin(t *testing.T) {
	// Not parallel (see startBalanced).
	b := setupOwners(t)
	rs := b.startBalanced(3, ownerTTL)
	d := b.start("R3", ownerTTL)
	b.waitBalanced(append(rs, d)...)
	got := d.held()
	if len(got) == 0 {
		t.Fatal("R3 holds nothing")
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		var from *replica
		for _, r := range rs {
			for _, ev := range r.eventsCopy() {
				if ev.Key == k && ev.Kind == ownership.HandedOver {
					from = r
				}
			}
		}
		if from == nil {
			t.Errorf("%s: R3 holds it, but no replica handed it over", k)
			continue
		}
		checkHandedOver(t, from, d, k)
	}
	noneLost(t, append(rs, d)...)
	checkNoOverlap(t, append(rs, d)...)
}

// TestLevelTableMismatch: a replica whose level table differs from a live
// replica's fails at start with an error wrapping ErrReplicaMismatch that
// names DELAYD_LEVELS, and creates no stream (no level stream of its
// table). Once the first replica crashed (its membership key then stays
// unchanged for the lease TTL) the new table is accepted; and once that
// one stops gracefully, the first table again at once.
func TestLevelTableMismatch(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	// expiryTTL: C waits for A's membership key to expire.
	a := b.start("A", expiryTTL)
	other := Config{Levels: levels.MustParse("200ms 500ms 2s"), LeaseTTL: expiryTTL}
	c := b.launch("B", other)
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		t.Fatal("B, with another level table, did not stop while A runs")
	}
	if !errors.Is(c.err, ErrReplicaMismatch) || !strings.Contains(fmt.Sprint(c.err), "DELAYD_LEVELS") {
		t.Fatalf("B's error: %v; want ErrReplicaMismatch naming DELAYD_LEVELS", c.err)
	}
	t.Logf("B: %v", c.err)
	if _, err := b.js.Stream(context.Background(), "DELAYD_2S"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("B refused to start, yet DELAYD_2S exists (or: %v)", err)
	}
	if !a.svc.Ready() {
		t.Errorf("A not ready after B's refusal: %v", a.svc.Unready())
	}

	a.nc.Close() // A crashes: its membership key stays, unchanged
	d := b.launch("C", other)
	waitReady(t, d)
	d.stopGracefully(t) // deletes its membership key: no wait for the next
	e := b.launch("D", Config{Levels: levels.MustParse(ownerLevels), LeaseTTL: expiryTTL})
	waitReady(t, e)
}

// waitReady waits until r is ready, failing if its Run returned.
func waitReady(t testing.TB, r *replica) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !r.svc.Ready() {
		select {
		case <-r.done:
			t.Fatalf("%s stopped: %v", r.name, r.err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v", r.name, r.svc.Unready())
		}
	}
}

// TestJanitorSingleton: of three replicas, only the one holding the
// janitor lease runs the id index trim.
func TestJanitorSingleton(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	var rs []*replica
	for i := range 3 {
		// IndexKeep 400 ms: a trim pass every 100 ms.
		r := b.launch(fmt.Sprintf("R%d", i), Config{Levels: levels.MustParse(ownerLevels), LeaseTTL: ownerTTL, IndexKeep: 400 * time.Millisecond})
		waitReady(t, r)
		rs = append(rs, r)
	}
	b.waitBalanced(rs...)
	passes := func() []uint64 {
		var out []uint64
		for _, r := range rs {
			out = append(out, r.svc.hooks.trimPasses.Load())
		}
		return out
	}
	janitor := holderOf(ownership.JanitorKey, rs...)
	if janitor == nil {
		t.Fatal("no replica holds the janitor lease")
	}
	j := slices.Index(rs, janitor)
	before := passes()
	deadline := time.Now().Add(time.Minute)
	for passes()[j] < before[j]+5 { // five trim passes of the janitor's
		if time.Now().After(deadline) {
			t.Fatalf("%s, the janitor, ran %d trim passes in a minute", janitor.name, passes()[j]-before[j])
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := passes()
	for i, r := range rs {
		if i != j && after[i] != before[i] {
			t.Errorf("%s ran %d trim passes while %s held the janitor lease", r.name, after[i]-before[i], janitor.name)
		}
	}
	if h := holderOf(ownership.JanitorKey, rs...); h != janitor {
		t.Fatalf("the janitor lease moved during the test")
	}
}

// BenchmarkLeaseTraffic measures the writes to DELAYD_LEASES of three
// replicas with the default level table (31 leases) and the default lease
// TTL, once they share the leases: lease renewals and membership renewals
// per second, over 10 s (docs/operations.md#several-replicas: (31 + 3) × 3 / T = 68
// per second). Run it once: go test ./deliver -run '^$' -bench
// BenchmarkLeaseTraffic -benchtime 1x
func BenchmarkLeaseTraffic(bm *testing.B) {
	b := setupOwners(bm)
	var rs []*replica
	for _, n := range []string{"A", "B", "C"} {
		r := b.launch(n, Config{LeaseTTL: lease.TTLDefault}) // the traffic at the default TTL
		waitReady(bm, r)
		rs = append(rs, r)
	}
	deadline := time.Now().Add(time.Minute)
	for settled := false; !settled; {
		settled = true
		for _, r := range rs {
			if live, share, held := r.svc.Balance(); live != 3 || held > share {
				settled = false
			}
		}
		if time.Now().After(deadline) {
			bm.Fatal("the replicas did not settle at their shares within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var leases, members atomic.Int64
	sub, err := b.nc.Subscribe("$KV."+lease.BucketName+".>", func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, "$KV."+lease.BucketName+"."+lease.MemberKeyPrefix) {
			members.Add(1)
		} else {
			leases.Add(1)
		}
	})
	if err != nil {
		bm.Fatal(err)
	}
	bm.ResetTimer()
	const window = 10 * time.Second
	time.Sleep(window) // a measurement window, not a wait for a condition
	_ = sub.Unsubscribe()
	for _, r := range rs {
		live, share, held := r.svc.Balance()
		bm.Logf("%s: live %d, share %d, holds %d", r.name, live, share, held)
	}
	bm.ReportMetric(float64(leases.Load())/window.Seconds(), "lease-writes/s")
	bm.ReportMetric(float64(members.Load())/window.Seconds(), "member-writes/s")
	bm.ReportMetric(0, "ns/op")
}

// TestPrecisionMismatch: a replica whose DELAYD_PRECISION differs from a
// live one's refuses to start, naming DELAYD_PRECISION, and changes no
// stream: one would write precision level streams the other neither
// expects nor shares. Both ways: B without precision levels beside A with
// them, and B with them beside A without (B's setup would create the
// precision level streams).
func TestPrecisionMismatch(t *testing.T) {
	t.Parallel()
	on, off := levels.MustParse(ownerLevels), levels.MustParse(ownerLevels).WithoutPrecision()
	for _, tc := range []struct {
		name string
		a, b levels.Table
	}{
		{"B off beside A on", on, off},
		{"B on beside A off", off, on},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupOwners(t)
			a := b.startConfig("A", Config{Levels: tc.a, LeaseTTL: ownerTTL})
			before := streamConfigs(t, b.js)
			c := b.launch("B", Config{Levels: tc.b, LeaseTTL: ownerTTL})
			select {
			case <-c.done:
			case <-time.After(20 * time.Second):
				t.Fatal("B, with another DELAYD_PRECISION, did not stop while A runs")
			}
			if !errors.Is(c.err, ErrReplicaMismatch) || !strings.Contains(fmt.Sprint(c.err), "DELAYD_PRECISION") {
				t.Fatalf("B's error: %v; want ErrReplicaMismatch naming DELAYD_PRECISION", c.err)
			}
			t.Logf("B: %v", c.err)
			if !a.svc.Ready() {
				t.Errorf("A not ready after B's refusal: %v", a.svc.Unready())
			}
			unchangedStreams(t, before, streamConfigs(t, b.js))
		})
	}
}

// streamState is what a refused replica must leave as it was: a stream's
// config and its creation time (a stream deleted and created again has a
// later one).
type streamState struct {
	Config  jetstream.StreamConfig
	Created time.Time
}

// streamConfigs returns every stream on the server, by name.
func streamConfigs(t *testing.T, js jetstream.JetStream) map[string]streamState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]streamState{}
	list := js.ListStreams(ctx)
	for si := range list.Info() {
		out[si.Config.Name] = streamState{si.Config, si.Created}
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unchangedStreams fails t for each stream created, deleted or changed
// between the snapshots before and after.
func unchangedStreams(t *testing.T, before, after map[string]streamState) {
	t.Helper()
	for name, a := range after {
		b, ok := before[name]
		switch {
		case !ok:
			t.Errorf("stream %s created by the refused replica", name)
		case !reflect.DeepEqual(a, b):
			t.Errorf("stream %s changed by the refused replica:\nbefore %+v\nafter  %+v", name, b, a)
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			t.Errorf("stream %s deleted by the refused replica", name)
		}
	}
}

// TestAnswerSettingsMismatch: a replica with another DELAYD_ANSWER_KEEP or
// DELAYD_ANSWER_MAX_BYTES beside a live one refuses to start, naming the
// variable: each replica's setup writes DELAYD_ANSWERS' MaxAge and
// MaxBytes, so two values would rewrite the stream back and forth.
func TestAnswerSettingsMismatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		variable string
		cfg      Config
	}{
		{"DELAYD_ANSWER_KEEP", Config{AnswerKeep: AnswerKeepDefault + time.Hour}},
		{"DELAYD_ANSWER_MAX_BYTES", Config{AnswerMaxBytes: 2 * AnswerMaxBytesDefault}},
	} {
		t.Run(tc.variable, func(t *testing.T) {
			t.Parallel()
			b := setupOwners(t)
			a := b.start("A", ownerTTL)
			before := streamConfigs(t, b.js)
			tc.cfg.Levels, tc.cfg.LeaseTTL = levels.MustParse(ownerLevels), ownerTTL
			c := b.launch("B", tc.cfg)
			select {
			case <-c.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("B, with another %s, did not stop while A runs", tc.variable)
			}
			if !errors.Is(c.err, ErrReplicaMismatch) || !strings.Contains(fmt.Sprint(c.err), tc.variable) {
				t.Fatalf("B's error: %v; want ErrReplicaMismatch naming %s", c.err, tc.variable)
			}
			if !a.svc.Ready() {
				t.Errorf("A not ready after B's refusal: %v", a.svc.Unready())
			}
			// B changed nothing: DELAYD_ANSWERS keeps A's MaxAge and MaxBytes.
			after := streamConfigs(t, b.js)
			if got := after[AnswerStream].Config; got.MaxAge != a.svc.cfg.AnswerKeep || got.MaxBytes != a.svc.cfg.AnswerMaxBytes {
				t.Errorf("%s after B's refusal: MaxAge %s, MaxBytes %d; want A's %s, %d",
					AnswerStream, got.MaxAge, got.MaxBytes, a.svc.cfg.AnswerKeep, a.svc.cfg.AnswerMaxBytes)
			}
			unchangedStreams(t, before, after)
		})
	}
}
