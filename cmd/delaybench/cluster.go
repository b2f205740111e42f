package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
)

const (
	// clusterNodes is the cluster rows' node count, and their streams'
	// replicas (R3).
	clusterNodes = 3
	// clusterTable is the cluster rows' level table: every message goes to
	// level 1, DELAYD_1S.
	clusterTable = "1s"
	// failoverStream is the failover rows' stream target (R3), on
	// "failover.>".
	failoverStream = "FAILOVER"
	// failoverQuiet is how long the failover load runs undisturbed, with
	// the leases balanced, before each stop and after the last.
	failoverQuiet = 2 * time.Second
)

// clusterReplicas are the delayd service counts of the R3 rows.
var clusterReplicas = []int{1, 2, 3}

var (
	clusterLevel = levels.StreamName(time.Second) // DELAYD_1S
	levelLease   = "level." + clusterLevel        // its lease key (docs/operations.md#several-replicas)
	routerLease  = "router"
)

// cluster runs the cluster scenario: burst and steady rows for R1 (one
// node, one service: the reference) and R3 with 1, 2 and 3 services, then
// the failover rows.
func (b *bench) cluster(ctx context.Context) ([]result, []string, error) {
	var rows []result
	note := []string{fmt.Sprintf("cluster: the %d nodes, every delayd service and the benchmark's clients run in this one process on %d cores: "+
		"the figures show the shape (ratios within this run), not a cluster's capacity", clusterNodes, runtime.NumCPU())}

	ref, err := b.clusterBurst(ctx, 1, 1)
	rows = append(rows, ref)
	if err != nil {
		return rows, note, fmt.Errorf("burst R1: %w", err)
	}
	for _, k := range clusterReplicas {
		r, err := b.clusterBurst(ctx, clusterNodes, k)
		if ref.MsgsPerS > 0 && r.MsgsPerS > 0 {
			r.R3OverR1 = ptr(r.MsgsPerS / ref.MsgsPerS)
		}
		rows = append(rows, r)
		if err != nil {
			return rows, note, fmt.Errorf("burst R3, %d replicas: %w", k, err)
		}
	}

	sref, err := b.clusterSteady(ctx, 1, 1)
	rows = append(rows, sref)
	if err != nil {
		return rows, note, fmt.Errorf("steady R1: %w", err)
	}
	for _, k := range clusterReplicas {
		r, err := b.clusterSteady(ctx, clusterNodes, k)
		if sref.Lateness != nil && r.Lateness != nil && sref.Lateness.P99 > 0 {
			r.R3OverR1 = ptr(r.Lateness.P99 / sref.Lateness.P99)
		}
		rows = append(rows, r)
		if err != nil {
			return rows, note, fmt.Errorf("steady R3, %d replicas: %w", k, err)
		}
	}

	frows, err := b.clusterFailover(ctx)
	rows = append(rows, frows...)
	if err != nil {
		return rows, note, fmt.Errorf("failover: %w", err)
	}
	return rows, note, nil
}

func ptr[T any](v T) *T { return &v }

// clusterEnv is a 1-node server (nodes 1) or a cluster of nodes.
func (b *bench) clusterEnv(ctx context.Context, nodes int) (*env, error) {
	if nodes == 1 {
		return b.newEnv()
	}
	return b.newClusterEnv(ctx, nodes)
}

// clusterConfig is the services' configuration: the level table "1s",
// every stream with a replica per node, and -cluster-lease-ttl.
func (b *bench) clusterConfig(nodes int) deliver.Config {
	return deliver.Config{Levels: levels.MustParse(clusterTable), Replicas: nodes, LeaseTTL: b.cfg.ClusterLeaseTTL}
}

// startReplicas starts k services, service i on node i (modulo the
// nodes): the first alone (it creates the streams), then the others at
// once, and waits until every one is ready.
func (e *env) startReplicas(ctx context.Context, k int, cfg deliver.Config) ([]*service, error) {
	svcs := make([]*service, k)
	errs := make([]error, k)
	if svcs[0], errs[0] = e.startReplica(ctx, 0, cfg); errs[0] != nil {
		return nil, errs[0]
	}
	var wg sync.WaitGroup
	for i := 1; i < k; i++ {
		wg.Go(func() { svcs[i], errs[i] = e.startReplica(ctx, i%len(e.nodes), cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = stopAll(svcs)
		return nil, err
	}
	return svcs, nil
}

// stopAll stops every service that runs (nil ones are skipped).
func stopAll(svcs []*service) error {
	var errs []error
	for _, s := range svcs {
		if s != nil {
			errs = append(errs, s.stop())
		}
	}
	return errors.Join(errs...)
}

// waitBalanced waits until every service is ready and counts them all
// live, every lease but except ("" for none) is held by exactly one of
// them, and the counts they hold differ by one at most (the Balancer's
// resting state).
func (b *bench) waitBalanced(ctx context.Context, label string, svcs []*service, except string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		why := unbalanced(svcs, except)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: leases not balanced within %s: %s", label, timeout, why)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// unbalanced says why the services' leases are not balanced; "" if they are.
func unbalanced(svcs []*service, except string) string {
	total := 0
	held := make([]int, len(svcs))
	holders := map[string]int{}
	for i, s := range svcs {
		if !s.svc.Ready() {
			return fmt.Sprintf("replica %d not ready: %s", i, strings.Join(s.svc.Unready(), "; "))
		}
		if live, _, _ := s.svc.Balance(); live != len(svcs) {
			return fmt.Sprintf("replica %d counts %d live replicas", i, live)
		}
		keys := 0
		for _, l := range s.svc.Leases() {
			if l.Key == except {
				if l.Held {
					return fmt.Sprintf("replica %d holds %s", i, except)
				}
				continue
			}
			keys++
			if l.Held {
				held[i]++
				holders[l.Key]++
			}
		}
		total = max(total, keys)
	}
	for key, n := range holders {
		if n > 1 {
			return fmt.Sprintf("lease %s held by %d replicas", key, n)
		}
	}
	if total == 0 || len(holders) < total {
		return fmt.Sprintf("%d of %d leases held", len(holders), total)
	}
	if slices.Max(held)-slices.Min(held) > 1 {
		return fmt.Sprintf("leases held per replica %v", held)
	}
	return ""
}

// ownerOf returns the index of the service holding lease key, or -1.
func ownerOf(svcs []*service, key string) int {
	for i, s := range svcs {
		if s != nil && holds(s, key) {
			return i
		}
	}
	return -1
}

func holds(s *service, key string) bool {
	for _, l := range s.svc.Leases() {
		if l.Key == key && l.Held {
			return true
		}
	}
	return false
}

// heldLeases counts the leases s holds now.
func heldLeases(s *service) int {
	n := 0
	for _, l := range s.svc.Leases() {
		if l.Held {
			n++
		}
	}
	return n
}

// failovers sums s's lease terms that ended without a release.
func failovers(s *service) uint64 {
	var n uint64
	for _, l := range s.svc.Leases() {
		n += l.Failovers
	}
	return n
}

// kill makes s look killed -9 to the cluster: its connection closes
// without a word, so its leases stay written until they expire. Its Run
// goroutines cannot reach the server any more; once its lease terms have
// ended (by its own fence, at most the lease TTL after its last renewal),
// its context is cancelled and Run awaited, as the process would be gone.
// The caller starts the replacement before calling reap.
func (s *service) kill() { s.nc.Close(); s.lnc.Close() }

// reap waits until a killed service holds no lease (up to 30 s), then
// ends its Run; Run's error says nothing after a kill and is dropped.
func (s *service) reap() error {
	deadline := time.Now().Add(30 * time.Second)
	for heldLeases(s) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s.cancel()
	select {
	case <-s.done:
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("killed delayd's Run did not return within 30s")
	}
}

// levelTerms counts the terms of DELAYD_1S's lease the services gained.
func levelTerms(svcs []*service) uint64 {
	var n uint64
	for _, s := range svcs {
		for _, l := range s.svc.Leases() {
			if l.Key == levelLease {
				n += l.Gained
			}
		}
	}
	return n
}

// levelNote says which replicas delivered how much of DELAYD_1S, and how
// many terms of its lease they gained since termsBefore were counted (1
// for a burst: the take-over at T; 0 for a steady load: no hand-over
// while measured).
func levelNote(svcs []*service, termsBefore uint64) string {
	var delivered []string
	for _, s := range svcs {
		var d uint64
		_, scanners := s.svc.Stats()
		for _, sc := range scanners {
			if sc.Stream == clusterLevel {
				d = sc.Delivered
			}
		}
		delivered = append(delivered, fmt.Sprint(d))
	}
	return fmt.Sprintf("%s delivered per replica: %s; terms of its lease begun while measured: %d", clusterLevel, strings.Join(delivered, " "),
		levelTerms(svcs)-termsBefore)
}

// clusterBurst runs k services, balanced, while the benchmark itself holds
// DELAYD_1S's lease (as a replica would: DELAYD_LEASES, key
// "level.DELAYD_1S"), so that no scanner delivers that level; publishes
// -cluster-burst-n messages at level 1 to a core target, which the
// services' router routes into DELAYD_1S; waits until the last is due;
// then, at T, releases the lease: a service takes it at once
// (docs/operations.md#several-replicas) and drains the level.
func (b *bench) clusterBurst(ctx context.Context, nodes, k int) (result, error) {
	n := b.cfg.ClusterBurstN
	label := fmt.Sprintf("cluster-burst R%d, %d replicas", nodes, k)
	row := result{Scenario: "cluster-burst", System: "delayd", Target: "core", N: n,
		Cluster: &clusterSetup{Nodes: nodes, StreamReplicas: nodes, Replicas: k}}
	e, err := b.clusterEnv(ctx, nodes)
	if err != nil {
		return row, err
	}
	defer e.close()
	bucket, err := lease.OpenBucket(ctx, e.js, lease.BucketConfig{Replicas: nodes})
	if err != nil {
		return row, err
	}
	hold, err := lease.New(bucket, lease.Config{Key: levelLease, Holder: "delaybench", TTL: b.cfg.ClusterLeaseTTL})
	if err != nil {
		return row, err
	}
	if err := hold.Acquire(ctx); err != nil {
		return row, err
	}
	defer func() { _ = hold.Release(context.Background()) }()
	svcs, err := e.startReplicas(ctx, k, b.clusterConfig(nodes))
	if err != nil {
		return row, err
	}
	defer func() { _ = stopAll(svcs) }()
	if err := b.waitBalanced(ctx, label, svcs, levelLease, time.Minute); err != nil {
		return row, err
	}
	const subject = "cburst.core"
	pub, err := b.publishAll(ctx, e, label, n, func(i int) *nats.Msg { return b.delaydMsg(i, subject, 1) })
	if err != nil {
		return row, err
	}
	row.Note = refusedNote(n, pub.acked)
	if !b.waitCount(ctx, label+": routed", pub.acked, 2*time.Minute, func() int { return int(routed(svcs)) }) {
		row.Note = notes(row.Note, fmt.Sprintf("routing timed out at %d", routed(svcs)))
	}
	last, err := lastDue(ctx, e, clusterLevel)
	if err != nil {
		return row, err
	}
	if err := sleepCtx(ctx, time.Until(last)+10*time.Millisecond); err != nil {
		return row, err
	}
	core, err := e.subscribe(subject, n)
	if err != nil {
		return row, err
	}
	if _, valid := hold.Held(); !valid {
		return row, fmt.Errorf("the benchmark lost %s's lease before T", clusterLevel)
	}
	t0 := time.Now()
	if err := hold.Release(ctx); err != nil {
		return row, err
	}
	b.waitCount(ctx, label+": delivered", n, 2*time.Minute, core.count)
	arrs := core.arrivals()
	row.Note = notes(row.Note, levelNote(svcs, 0))
	err = stopAll(svcs)
	svcs = nil
	if err != nil {
		return row, err
	}
	t := count(arrs, n, func(a arrival) time.Time { return later(a.due, t0) })
	row.Lost, row.Early, row.Lateness, row.Duplicates = t.lost, t.early, t.lateness, ptr(t.dups)
	if t.distinct > 0 {
		row.MsgsPerS = float64(t.distinct) / t.last.Sub(t0).Seconds()
		row.Note = notes(row.Note, fmt.Sprintf("first arrival %s after T, last %s", t.first.Sub(t0).Round(time.Millisecond), t.last.Sub(t0).Round(time.Millisecond)))
	}
	return row, nil
}

// routed sums the services' routers' routed messages.
func routed(svcs []*service) uint64 {
	var n uint64
	for _, s := range svcs {
		rs, _ := s.svc.Stats()
		n += rs.Routed
	}
	return n
}

// clusterSteady starts k services, waits until their leases are
// balanced, then offers -cluster-rate msg/s for -cluster-duration, each due
// 1 s after it is published, to a core target.
func (b *bench) clusterSteady(ctx context.Context, nodes, k int) (result, error) {
	label := fmt.Sprintf("cluster-steady R%d, %d replicas", nodes, k)
	row := result{Scenario: "cluster-steady", System: "delayd", Target: "core",
		Cluster: &clusterSetup{Nodes: nodes, StreamReplicas: nodes, Replicas: k}}
	e, err := b.clusterEnv(ctx, nodes)
	if err != nil {
		return row, err
	}
	defer e.close()
	svcs, err := e.startReplicas(ctx, k, b.clusterConfig(nodes))
	if err != nil {
		return row, err
	}
	defer func() { _ = stopAll(svcs) }()
	if err := b.waitBalanced(ctx, label, svcs, "", time.Minute); err != nil {
		return row, err
	}
	const subject = "csteady.core"
	terms := levelTerms(svcs)
	total := int(float64(b.cfg.ClusterRate) * b.cfg.ClusterDur.Seconds())
	core, err := e.subscribe(subject, total)
	if err != nil {
		return row, err
	}
	p, err := b.publishRate(ctx, e, label, b.cfg.ClusterRate, total, nil, nil, func(i int) *nats.Msg { return b.delaydMsg(i, subject, 1) })
	if err != nil {
		return row, err
	}
	b.waitCount(ctx, label+": delivered", p.sent, time.Minute, core.count)
	row.Note = notes(refusedNote(p.sent, p.sent-p.refused), levelNote(svcs, terms))
	err = stopAll(svcs)
	svcs = nil
	if err != nil {
		return row, err
	}
	t := count(core.arrivals(), p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness, row.Duplicates = t.lost, t.early, t.lateness, ptr(t.dups)
	return row, nil
}

// stopEvent is one stop of DELAYD_1S's owner in the failover rows.
type stopEvent struct {
	at         time.Time // just before the stop
	kill       bool      // killed, else stopped gracefully
	leases     int       // leases the owner held then
	router     bool      // it held the router lease too
	unreleased uint64    // its lease terms that ended without a release
}

// clusterFailover runs 3 services under a load of -cluster-rate msg/s at
// level "1s" to an R3 stream target, and stops DELAYD_1S's owner
// -cluster-kills times killed, then as many times gracefully, starting a
// new service on its node at once each time.
func (b *bench) clusterFailover(ctx context.Context) ([]result, error) {
	const label = "cluster-failover"
	kills := b.cfg.ClusterKills
	setup := &clusterSetup{Nodes: clusterNodes, StreamReplicas: clusterNodes, Replicas: clusterNodes}
	e, err := b.clusterEnv(ctx, clusterNodes)
	if err != nil {
		return nil, err
	}
	defer e.close()
	cfg := b.clusterConfig(clusterNodes)
	svcs, err := e.startReplicas(ctx, clusterNodes, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stopAll(svcs) }()
	if err := e.createStream(ctx, jetstream.StreamConfig{Name: failoverStream, Subjects: []string{"failover.>"}, Replicas: clusterNodes}); err != nil {
		return nil, err
	}
	if err := b.waitBalanced(ctx, label, svcs, "", time.Minute); err != nil {
		return nil, err
	}

	// The load runs until every stop is done.
	var sent atomic.Int64
	stop := make(chan struct{})
	type published struct {
		p   paced
		err error
	}
	pubDone := make(chan published, 1)
	go func() {
		p, err := b.publishRate(ctx, e, label, b.cfg.ClusterRate, 0, stop, &sent, func(i int) *nats.Msg { return b.delaydMsg(i, "failover.s", 1) })
		pubDone <- published{p, err}
	}()
	events, boundary, runErr := b.stopOwners(ctx, e, cfg, svcs, kills, &sent)
	if runErr == nil {
		runErr = b.waitBalanced(ctx, label, svcs, "", time.Minute)
	}
	if runErr == nil {
		runErr = sleepCtx(ctx, failoverQuiet)
	}
	close(stop)
	pub := <-pubDone
	if err := firstErr(runErr, pub.err); err != nil {
		return nil, err
	}

	acked := pub.p.sent - pub.p.refused
	if _, _, err := e.waitStreamMsgs(ctx, failoverStream, uint64(acked), 2*time.Minute); err != nil && !errors.Is(err, errTimeout) {
		return nil, err
	}
	r, err := e.readStream(ctx, failoverStream, "", pub.p.sent, dueHeader)
	if err != nil {
		return nil, err
	}
	b.waitCount(ctx, label+": read back", acked, time.Minute, r.count)
	arrs := r.stop()

	times := make([]time.Time, len(arrs))
	for i, a := range arrs {
		times[i] = a.at
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	gaps := gapsAfter(times, events)

	var killArrs, gracefulArrs []arrival
	for _, a := range arrs {
		if a.idx < boundary {
			killArrs = append(killArrs, a)
		} else {
			a.idx -= boundary
			gracefulArrs = append(gracefulArrs, a)
		}
	}
	rate := float64(pub.p.sent) / pub.p.elapsed.Seconds()
	row := func(kind string, evs []stopEvent, gaps []time.Duration, arrs []arrival, n int) result {
		t := count(arrs, n, func(a arrival) time.Time { return a.due })
		r := result{Scenario: label + "-" + kind, System: "delayd", Target: "stream", N: n, MsgsPerS: rate, Cluster: setup,
			Lost: t.lost, Early: t.early, Lateness: t.lateness, Duplicates: ptr(t.dups), Events: len(evs)}
		sorted := slices.Clone(gaps)
		slices.Sort(sorted)
		if len(sorted) > 0 {
			r.Gap = &lateness{P50: msOf(pct(sorted, 50)), P99: msOf(pct(sorted, 99)), Max: msOf(sorted[len(sorted)-1])}
		}
		var unreleased uint64
		var router int
		var each []string
		for i, ev := range evs {
			unreleased += ev.unreleased
			if ev.router {
				router++
			}
			each = append(each, fmt.Sprint(gaps[i].Round(time.Millisecond)))
		}
		r.Unreleased = ptr(int(unreleased))
		r.Note = fmt.Sprintf("gap after each stop: %s; the owner held the router lease too in %d of %d", strings.Join(each, " "), router, len(evs))
		return r
	}
	return []result{
		row("kill", events[:kills], gaps[:kills], killArrs, boundary),
		row("graceful", events[kills:], gaps[kills:], gracefulArrs, pub.p.sent-boundary),
	}, nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// stopOwners stops DELAYD_1S's owner kills times by a kill, then kills
// times gracefully, each once the leases are balanced and the load ran
// [failoverQuiet] undisturbed, and starts a new service on its node at
// once. It replaces the stopped services in svcs. boundary is how many
// messages were published when the graceful stops began: the messages
// of the kill phase are those below it.
func (b *bench) stopOwners(ctx context.Context, e *env, cfg deliver.Config, svcs []*service, kills int, sent *atomic.Int64) (events []stopEvent, boundary int, err error) {
	for i := range 2 * kills {
		kill := i < kills
		if err := b.waitBalanced(ctx, "cluster-failover", svcs, "", time.Minute); err != nil {
			return events, boundary, err
		}
		if i == kills {
			boundary = int(sent.Load())
		}
		if err := sleepCtx(ctx, failoverQuiet); err != nil {
			return events, boundary, err
		}
		owner := ownerOf(svcs, levelLease)
		if owner < 0 {
			return events, boundary, fmt.Errorf("no replica holds %s", levelLease)
		}
		old := svcs[owner]
		ev := stopEvent{kill: kill, leases: heldLeases(old), router: holds(old, routerLease)}
		before := failovers(old)
		ev.at = time.Now()
		if kill {
			old.kill()
		} else if err := old.stop(); err != nil {
			return events, boundary, fmt.Errorf("graceful stop: %w", err)
		}
		svcs[owner], err = e.startReplica(ctx, old.node, cfg)
		if err != nil {
			svcs[owner] = nil
			return events, boundary, err
		}
		if kill {
			if err := old.reap(); err != nil {
				return events, boundary, err
			}
		}
		ev.unreleased = failovers(old) - before
		events = append(events, ev)
		how := "killed"
		if !kill {
			how = "stopped gracefully"
		}
		b.logf("cluster-failover: %d/%d: the owner of %s on node %d %s (it held %d leases; %d terms ended unreleased)",
			i+1, 2*kills, clusterLevel, old.node, how, ev.leases, ev.unreleased)
	}
	return events, boundary, nil
}

// gapsAfter returns, for each event, the longest time between two
// consecutive times (sorted) whose second lies after the event and not
// after the next event: the gap the event caused, counted from the last
// time before it.
func gapsAfter(times []time.Time, events []stopEvent) []time.Duration {
	gaps := make([]time.Duration, len(events))
	for i, ev := range events {
		var end time.Time
		if i+1 < len(events) {
			end = events[i+1].at
		}
		for j := 1; j < len(times); j++ {
			if !times[j].After(ev.at) {
				continue
			}
			if !end.IsZero() && times[j].After(end) {
				break
			}
			gaps[i] = max(gaps[i], times[j].Sub(times[j-1]))
		}
	}
	return gaps
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
