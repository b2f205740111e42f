package cluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
)

// Load subjects and the target stream of [load].
const (
	loadStream        = "LOADTARGET" // the stream-bound target, R3, capturing loadStreamSubject.>
	loadStreamSubject = "load.s"     // message i's target is loadStreamSubject.l<level> for even i
	loadCoreSubject   = "load.c"     // and loadCoreSubject.l<level> for odd i, a core subject
	loadShortStream   = "LOADSHORT"  // with loadConfig.ShortDuplicates, a second stream-bound target, R3, capturing loadShortSubject.>
	loadShortSubject  = "load.w"     // the target of i%4 == 2 then (and loadStreamSubject of i%4 == 0)
)

// loadConfig is a load of Total messages published at Rate per second.
// Message i carries its index as payload, Nats-Msg-Id "load-<i>" (so a
// publish retried after a lost PubAck is stored once at ingress) and
// Delay-Level i%Levels.Len()+1; it goes to the stream-bound target for
// even i and to the core target for odd i.
type loadConfig struct {
	Total  int
	Rate   int          // messages offered per second; the publishers fall behind while the cluster cannot store
	Levels levels.Table // delayd's level table (DELAYD_LEVELS), for the send-time bound of each delivery

	// IngressPartitions is delayd's DELAYD_INGRESS_PARTITIONS: above 1, each level is that many partition
	// streams, each checked on its own. 0 is 1.
	IngressPartitions int

	// TargetDuplicates is the stream-bound target's duplicate window. 0 is JetStream's default (2 minutes). A
	// fault longer than it (a node hung with writes in its sockets) shows that no late write doubles a delivery.
	TargetDuplicates time.Duration

	// ShortDuplicates, when not 0, adds a second stream-bound target (loadShortStream) with this duplicate
	// window, which takes half the stream-target messages (i%4 == 2). Its duplicates are a figure, bounded as
	// core re-deliveries are (checkShort): a delivery a hung node holds in its sockets and stores when it
	// resumes, after the window, is a double delayd cannot fence at a user's stream
	// (docs/guarantees.md#stream-targets-and-their-duplicate-window).
	ShortDuplicates time.Duration
}

// targetOf returns message i's target: 0 the stream-bound target, 1 the
// core target, 2 the short-window stream-bound target.
func (c loadConfig) targetOf(i int) int {
	if i%2 == 1 {
		return 1
	}
	if c.ShortDuplicates > 0 && i%4 == 2 {
		return 2
	}
	return 0
}

// levelStreams returns the streams of level lvl: one, or one per ingress partition.
func (c loadConfig) levelStreams(lvl levels.Level) []string {
	return levels.Partitions{}.WithIngress(c.IngressPartitions).Streams(lvl.Delay)
}

// markerSubjectOf returns the epoch marker subject of a level stream.
func markerSubjectOf(stream string) string {
	return "delayd.level." + strings.TrimPrefix(stream, levels.StreamPrefix) + ".delayd.router.epoch"
}

// load publishes a [loadConfig] through JetStream (each message retried
// until its PubAck, for up to two minutes) and records what arrives at both
// targets, for [load.report]. The core target is recorded on the
// connection given to newLoad, so that connection must stay up through the
// faults a test makes (a client on a node the test does not stop).
type load struct {
	t      *testing.T
	cfg    loadConfig
	nc     *nats.Conn
	js     jetstream.JetStream
	target jetstream.Stream
	short  jetstream.Stream // the short-window stream-bound target, with cfg.ShortDuplicates
	core   *itest.Recorder  // receive times at the core target

	mu      sync.Mutex
	sent    []time.Time // the start of each message's first publish attempt
	isAcked []bool
	failed  []string // messages given up on

	streamGot []itest.Delivery // what report read from the target streams (both, with cfg.ShortDuplicates)

	// nodeKills are the times of SIGKILLs of NATS nodes (nodeKilled): a
	// core delivery the killed node had taken (its flush answered) but not
	// yet forwarded over its route to the subscriber's node is gone with
	// it (docs/guarantees.md#a-core-delivery-between-nodes-at-a-node-kill). Core-target messages due within
	// a kill's window before it may be missing, and are counted apart.
	nodeKills []nodeKill

	nAcked  atomic.Int64
	retries atomic.Int64
	done    chan struct{}
	began   time.Time

	// The routers' epoch markers (docs/guarantees.md#epoch-markers) also take
	// level-stream sequences: base is each level stream's last sequence
	// when the load began (markers only, since the load wrote nothing
	// yet), baseEpoch the epoch of its newest marker then, and markers
	// the epochs of the markers written since, by level stream. A term
	// stores one marker per level stream.
	base      map[string]uint64
	baseEpoch map[string]uint64
	markers   map[string]map[uint64]bool
}

// newLoad creates the target stream (R3, file storage; and the
// short-window one with cfg.ShortDuplicates) and subscribes to the core
// target on nc. Start publishing with start.
func newLoad(t *testing.T, nc *nats.Conn, js jetstream.JetStream, cfg loadConfig) *load {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: loadStream, Subjects: []string{loadStreamSubject + ".>"},
		Storage: jetstream.FileStorage, Replicas: 3, Duplicates: cfg.TargetDuplicates})
	if err != nil {
		t.Fatalf("create target stream %s: %v", loadStream, err)
	}
	l := &load{t: t, cfg: cfg, nc: nc, js: js, target: s, core: itest.NewRecorder(t),
		sent: make([]time.Time, cfg.Total), isAcked: make([]bool, cfg.Total), done: make(chan struct{})}
	if cfg.ShortDuplicates > 0 {
		l.short, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: loadShortStream, Subjects: []string{loadShortSubject + ".>"},
			Storage: jetstream.FileStorage, Replicas: 3, Duplicates: cfg.ShortDuplicates})
		if err != nil {
			t.Fatalf("create target stream %s: %v", loadShortStream, err)
		}
	}
	l.core.Subscribe(nc, loadCoreSubject+".>")
	for i := range cfg.Total {
		if i%2 == 1 {
			l.core.ExpectKeys(strconv.Itoa(i))
		}
	}
	l.watchMarkers(nc)
	return l
}

// watchMarkers records the epoch markers written from now on (a core
// subscriber sees every marker published; a router writes one only right
// after syncing the level's tail, so each is stored unless another router
// wrote in between, which the level check then reports), and each level
// stream's last sequence and newest marker epoch now.
func (l *load) watchMarkers(nc *nats.Conn) {
	l.t.Helper()
	l.base, l.baseEpoch, l.markers = map[string]uint64{}, map[string]uint64{}, map[string]map[uint64]bool{}
	sub, err := nc.Subscribe(itest.MarkerSubjects, func(m *nats.Msg) {
		name := strings.Split(m.Subject, ".")[2]
		epoch, err := strconv.ParseUint(m.Header.Get("Delayd-Router-Epoch"), 10, 64)
		if err != nil {
			l.t.Errorf("epoch marker on %s without an epoch: %v", m.Subject, m.Header)
			return
		}
		stream := levels.StreamPrefix + name
		l.mu.Lock()
		if l.markers[stream] == nil {
			l.markers[stream] = map[uint64]bool{}
		}
		l.markers[stream][epoch] = true
		l.mu.Unlock()
	})
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		l.t.Fatal(err)
	}
	// A router term that began just before the subscription (the replica
	// was started and found ready just before the load) may be writing its
	// markers now: one published before the subscription's interest
	// reached the router's node and stored after the base is read would
	// count as a level message. So the base is read once every level
	// stream holds a marker (up to 30 s: a test whose router starts later
	// has its markers seen by the subscription).
	var streams []string
	for _, lvl := range l.cfg.Levels.Levels() {
		streams = append(streams, l.cfg.levelStreams(lvl)...)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range streams {
		for time.Now().Before(deadline) {
			wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := l.js.Stream(wctx, name)
			if err == nil {
				_, err = s.GetLastMsgForSubject(wctx, markerSubjectOf(name))
			}
			wcancel()
			if err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range streams {
		s, err := l.js.Stream(ctx, name)
		if err != nil {
			l.t.Fatalf("level stream %s: %v", name, err)
		}
		l.mu.Lock()
		l.base[name] = s.CachedInfo().State.LastSeq
		l.mu.Unlock()
		m, err := s.GetLastMsgForSubject(ctx, markerSubjectOf(name))
		if err == nil {
			e, _ := strconv.ParseUint(m.Header.Get("Delayd-Router-Epoch"), 10, 64)
			l.mu.Lock()
			l.baseEpoch[name] = e
			l.mu.Unlock()
		}
	}
}

// markersSince returns how many epoch markers stream got since the load
// began: the terms that marked it, after the newest marker then.
func (l *load) markersSince(stream string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := uint64(0)
	for e := range l.markers[stream] {
		if e > l.baseEpoch[stream] {
			n++
		}
	}
	return n
}

// loadPublishers is how many publishes are in flight at once.
const loadPublishers = 8

// start publishes the load in the background, paced at cfg.Rate.
func (l *load) start() {
	l.began = time.Now()
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range l.cfg.Total {
			time.Sleep(time.Until(l.began.Add(time.Duration(i) * time.Second / time.Duration(l.cfg.Rate)))) // pacing the offered rate
			next <- i
		}
	}()
	var wg sync.WaitGroup
	for range loadPublishers {
		wg.Go(func() {
			for i := range next {
				l.publish(i)
			}
		})
	}
	go func() { wg.Wait(); close(l.done) }()
}

// publish publishes message i until it has a PubAck, for up to two minutes.
func (l *load) publish(i int) {
	lvl := i%l.cfg.Levels.Len() + 1
	subject := []string{loadStreamSubject, loadCoreSubject, loadShortSubject}[l.cfg.targetOf(i)]
	msg := &nats.Msg{Subject: fmt.Sprintf("delay.%s.l%d", subject, lvl), Data: []byte(strconv.Itoa(i)), Header: itest.Level(lvl)}
	msg.Header.Set(contract.HeaderNatsMsgID, fmt.Sprintf("load-%d", i))
	first := time.Now()
	l.mu.Lock()
	l.sent[i] = first
	l.mu.Unlock()
	var err error
	for time.Since(first) < 2*time.Minute {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = l.js.PublishMsg(ctx, msg)
		cancel()
		if err == nil {
			l.mu.Lock()
			l.isAcked[i] = true
			l.mu.Unlock()
			l.nAcked.Add(1)
			return
		}
		l.retries.Add(1)
		time.Sleep(100 * time.Millisecond) // pacing a retry while the cluster elects a leader
	}
	l.mu.Lock()
	l.failed = append(l.failed, fmt.Sprintf("%d: %v", i, err))
	l.mu.Unlock()
}

// acked returns how many messages have their PubAck.
func (l *load) acked() int { return int(l.nAcked.Load()) }

// waitAcked waits up to timeout until at least n messages have their
// PubAck; a test makes its faults at points of the load this way.
func (l *load) waitAcked(n int, timeout time.Duration) {
	l.t.Helper()
	itest.WaitFor(l.t, timeout, fmt.Sprintf("%d of %d messages acked", n, l.cfg.Total), func() bool { return l.acked() >= n })
}

// waitCaughtUp waits up to timeout until the core target has received
// every core message that was acked and fell due (its first publish's start
// plus its level's delay) more than a second ago: the deliveries have
// caught up with the load, so a fault made next meets no backlog of an
// earlier one.
func (l *load) waitCaughtUp(timeout time.Duration) {
	l.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		missing := l.overdue()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("timed out after %s waiting for deliveries to catch up with the load: %s", timeout, l.describeOverdue(missing))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// coreKillWindow is the least of how long before a node's SIGKILL a
// core delivery may be due and still be lost with the node: the killed
// node answered the flush that confirmed it, but its route to the
// subscriber's node had not sent it yet (delivered at due + lateness, so
// due up to the lateness before the kill). A kill's window is the larger
// of this and the lateness measured just before it (nodeKilled): on a
// loaded machine under -race the lateness can pass 2 s.
const coreKillWindow = 2 * time.Second

// nodeKill is a SIGKILL of a NATS node: when, and its window (atKill).
type nodeKill struct {
	at     time.Time
	window time.Duration
}

// nodeKilled records a SIGKILL of a NATS node at at (see nodeKills). Its
// window is coreKillWindow, or more if the core deliveries received in the
// 5 s before at were later than that: the largest of their lateness, plus
// 500 ms.
func (l *load) nodeKilled(at time.Time) {
	window := coreKillWindow
	for _, d := range l.core.Snapshot() {
		if d.At.Before(at) && d.At.After(at.Add(-5*time.Second)) && !d.Due.IsZero() {
			window = max(window, d.At.Sub(d.Due)+500*time.Millisecond)
		}
	}
	if window > coreKillWindow {
		l.t.Logf("node kill at %s: core lateness just before it was up to %s; a delivery due %s before it may be lost with the node",
			at.Format("15:04:05.000"), window-500*time.Millisecond, window)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodeKills = append(l.nodeKills, nodeKill{at: at, window: window})
}

// atKill reports whether message i was due within its kill's window
// before a node kill, or up to 100 ms after it (clocks of one machine).
// l.mu held.
func (l *load) atKill(i int) bool {
	lvl, _ := l.cfg.Levels.Level(i%l.cfg.Levels.Len() + 1)
	due := l.sent[i].Add(lvl.Delay)
	for _, k := range l.nodeKills {
		if due.After(k.at.Add(-k.window)) && due.Before(k.at.Add(100*time.Millisecond)) {
			return true
		}
	}
	return false
}

// overdue returns the acked core-target messages (odd indexes) due more
// than a second ago that the core target has not received, except those
// due at a node kill (atKill).
func (l *load) overdue() []int {
	got := l.core.Counts()
	horizon := time.Now().Add(-time.Second)
	l.mu.Lock()
	defer l.mu.Unlock()
	var missing []int
	for i := 1; i < l.cfg.Total; i += 2 {
		if !l.isAcked[i] {
			continue
		}
		lvl, _ := l.cfg.Levels.Level(i%l.cfg.Levels.Len() + 1)
		if l.sent[i].Add(lvl.Delay).Before(horizon) && got[strconv.Itoa(i)] == 0 && !l.atKill(i) {
			missing = append(missing, i)
		}
	}
	return missing
}

// describeOverdue says which levels the overdue messages are in, how long
// past due the oldest of each is, and what delayd's stats API answers
// (owners and offsets), for a failure message.
func (l *load) describeOverdue(missing []int) string {
	type lv struct {
		n      int
		oldest int
	}
	by := map[int]*lv{}
	for _, i := range missing {
		n := i%l.cfg.Levels.Len() + 1
		if by[n] == nil {
			by[n] = &lv{oldest: i}
		}
		by[n].n++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d overdue", len(missing))
	l.mu.Lock()
	for n := 1; n <= l.cfg.Levels.Len(); n++ {
		if v := by[n]; v != nil {
			lvl, _ := l.cfg.Levels.Level(n)
			fmt.Fprintf(&b, "; level %d (%s): %d, the oldest %d due %s ago", n, lvl.Stream(), v.n, v.oldest,
				time.Since(l.sent[v.oldest].Add(lvl.Delay)).Round(time.Millisecond))
		}
	}
	l.mu.Unlock()
	if m, err := l.nc.Request(contract.StatsSubject, nil, 5*time.Second); err != nil {
		fmt.Fprintf(&b, "; stats API: %v", err)
	} else {
		fmt.Fprintf(&b, "; stats API: %s", m.Data)
	}
	return b.String()
}

// waitPublished waits up to timeout until every publisher is done and fails
// the test unless every message has its PubAck.
func (l *load) waitPublished(timeout time.Duration) {
	l.t.Helper()
	select {
	case <-l.done:
	case <-time.After(timeout):
		l.t.Fatalf("publishing not done within %s: %d of %d acked", timeout, l.acked(), l.cfg.Total)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failed) > 0 {
		l.t.Fatalf("%d messages never acked, e.g. %q", len(l.failed), l.failed[:min(len(l.failed), 5)])
	}
}

// streamStored returns how many messages the target streams hold in all
// (both, with cfg.ShortDuplicates), or -1 if a question fails.
func (l *load) streamStored() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0
	for _, s := range []jetstream.Stream{l.target, l.short} {
		if s == nil {
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			return -1
		}
		n += int(info.State.Msgs)
	}
	return n
}

// waitDelivered waits up to timeout until the target streams hold as many
// messages as the load sent them and the core target received every message
// the load sent it at least once, then until neither count changes for a
// second (a late duplicate would show by then). If they fall short by the
// timeout it logs the counts and returns: report names what is lost.
func (l *load) waitDelivered(timeout time.Duration) {
	l.t.Helper()
	wantStream, wantCore := (l.cfg.Total+1)/2, l.cfg.Total/2
	deadline := time.Now().Add(timeout)
	var stored uint64
	var distinct int
	for {
		if n := l.streamStored(); n >= 0 {
			stored = uint64(n)
		}
		distinct = len(l.core.Counts())
		if stored >= uint64(wantStream) && distinct >= wantCore {
			break
		}
		if time.Now().After(deadline) {
			// The report says which: a test fails on it.
			l.t.Logf("within %s: target streams hold %d of %d, core target received %d of %d", timeout, stored, wantStream, distinct, wantCore)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	itest.WaitQuiet(l.t, time.Second, timeout, func() int {
		n := l.streamStored()
		if n < 0 {
			return -1
		}
		return n + len(l.core.Snapshot())
	})
}

// targetReport is what one target saw of a load.
type targetReport struct {
	Expected    int           // messages the load sent to this target
	Deliveries  int           // deliveries seen (stored, or received)
	Lost        int           // expected messages never delivered
	LostAtKill  int           // of Lost, core-target messages due at a node's SIGKILL (load.atKill)
	Duplicates  int           // deliveries beyond the first of a message (by payload index)
	Unexpected  int           // deliveries of a message not sent to this target
	Early       int           // deliveries before their Delay-Due-At, or without one ([delivery.early])
	EarlyBySend int           // deliveries before the start of their first publish plus their level's delay
	Lateness    latency       // seen minus Delay-Due-At
	LostKeys    []string      // up to 10 lost messages
	DupKeys     []string      // up to 10 duplicated messages, "i×n"
	EarlyKeys   []string      // up to 10 early deliveries
	LongestGap  time.Duration // the longest time between two deliveries in a row
	GapFrom     time.Time     // when that gap began
}

// latency summarizes durations.
type latency struct{ P50, P99, Max time.Duration }

func (l latency) String() string { return fmt.Sprintf("p50=%s p99=%s max=%s", l.P50, l.P99, l.Max) }

// loadReport is what both targets of a load saw.
type loadReport struct {
	Published, Retries int
	Stream, Core       targetReport
	Short              *targetReport // the short-window stream-bound target, with cfg.ShortDuplicates
	Levels             []levelWrites // one per level of the table
	Ingress            uint64        // messages still in DELAYD_INGRESS (not routed yet)
}

// levelWrites compares what the load sent to a level with what its level
// stream holds in all: docs/guarantees.md#exactly-once-into-the-level-streams says
// the router writes each ingress message to its level stream once, so the
// sequences the stream took since the load began, less the routers' epoch
// markers, are the number of messages the load sent there (only the load
// writes to the levels in these tests; scanners purge delivered messages
// but sequences go on).
type levelWrites struct {
	Stream  string
	Sent    int    // load messages at this level
	Written uint64 // the level stream's sequences since the load began, less the epoch markers
	Markers uint64 // epoch markers written since the load began
}

func (r loadReport) String() string {
	f := func(name string, t targetReport) string {
		return fmt.Sprintf("%s: expected=%d deliveries=%d lost=%d (due at a node kill %d) duplicates=%d unexpected=%d early=%d early_by_send=%d lateness %s, longest gap %s from %s",
			name, t.Expected, t.Deliveries, t.Lost, t.LostAtKill, t.Duplicates, t.Unexpected, t.Early, t.EarlyBySend, t.Lateness,
			t.LongestGap.Round(time.Millisecond), t.GapFrom.Format("15:04:05.000"))
	}
	var lv []string
	for _, w := range r.Levels {
		lv = append(lv, fmt.Sprintf("%s sent=%d written=%d markers=%d", w.Stream, w.Sent, w.Written, w.Markers))
	}
	short := ""
	if r.Short != nil {
		short = "\n  " + f("short-window stream target", *r.Short)
	}
	return fmt.Sprintf("published=%d (publish retries %d)\n  %s%s\n  %s\n  level streams: %s; %s holds %d", r.Published, r.Retries,
		f("stream target", r.Stream), short, f("core target", r.Core), strings.Join(lv, ", "), deliver.IngressStream, r.Ingress)
}

// report reads the target stream and counts, for each target, lost, early
// and duplicate deliveries. Call it after waitPublished and waitDelivered.
func (l *load) report() loadReport {
	l.t.Helper()
	read := func(name string) []itest.Delivery {
		r := itest.NewRecorder(l.t)
		r.AddStream((&itest.Bundle{T: l.t, JS: l.js}).StreamMsgs(name))
		return r.Snapshot()
	}
	got := read(loadStream)
	var short []itest.Delivery
	if l.short != nil {
		short = read(loadShortStream)
	}
	l.mu.Lock()
	sent := slices.Clone(l.sent)
	l.streamGot = append(slices.Clone(got), short...)
	l.mu.Unlock()
	rep := loadReport{
		Published: l.acked(),
		Retries:   int(l.retries.Load()),
		Stream:    l.targetReport(got, 0, sent),
		Core:      l.targetReport(l.core.Snapshot(), 1, sent),
	}
	if l.short != nil {
		r := l.targetReport(short, 2, sent)
		rep.Short = &r
	}
	rep.Ingress = l.streamMsgs(deliver.IngressStream)
	for _, lvl := range l.cfg.Levels.Levels() {
		w := levelWrites{Stream: lvl.Stream()}
		if l.cfg.IngressPartitions > 1 {
			w.Stream += fmt.Sprintf(" (%d partitions)", l.cfg.IngressPartitions)
		}
		for i := range l.cfg.Total {
			if i%l.cfg.Levels.Len()+1 == lvl.Index {
				w.Sent++
			}
		}
		for _, name := range l.cfg.levelStreams(lvl) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := l.js.Stream(ctx, name)
			if err == nil {
				var info *jetstream.StreamInfo
				if info, err = s.Info(ctx); err == nil {
					l.mu.Lock()
					base := l.base[name]
					l.mu.Unlock()
					markers := l.markersSince(name)
					w.Markers += markers
					w.Written += info.State.LastSeq - base - markers
				}
			}
			cancel()
			if err != nil {
				l.t.Errorf("level stream %s: %v", name, err)
			}
		}
		rep.Levels = append(rep.Levels, w)
	}
	return rep
}

// streamMsgs returns how many messages stream holds now (0 if it cannot
// tell, which it reports).
func (l *load) streamMsgs(stream string) uint64 {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := l.js.Stream(ctx, stream)
	if err != nil {
		l.t.Errorf("stream %s: %v", stream, err)
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		l.t.Errorf("stream %s: %v", stream, err)
		return 0
	}
	return info.State.Msgs
}

// checkLevels fails the test for a level stream that holds fewer or more
// messages than the load sent to its level
// (docs/guarantees.md#exactly-once-into-the-level-streams): fewer means the router lost a message before any
// scanner saw it.
func (r loadReport) checkLevels(t *testing.T) {
	t.Helper()
	for _, w := range r.Levels {
		if w.Written != uint64(w.Sent) {
			t.Errorf("level stream %s: %d messages written, the load sent %d to its level", w.Stream, w.Written, w.Sent)
		}
	}
}

// targetReport counts what a target saw; target is its number in
// loadConfig.targetOf.
func (l *load) targetReport(got []itest.Delivery, target int, sent []time.Time) targetReport {
	r := targetReport{Deliveries: len(got)}
	n := make(map[int]int)
	var late []time.Duration
	var times []time.Time
	for _, d := range got {
		times = append(times, d.At)
		i, err := strconv.Atoi(d.Key)
		if err != nil || i < 0 || i >= l.cfg.Total || l.cfg.targetOf(i) != target {
			r.Unexpected++
			continue
		}
		n[i]++
		lvl, _ := l.cfg.Levels.Level(i%l.cfg.Levels.Len() + 1)
		early := d.Early()
		if early {
			r.Early++
		}
		if d.At.Before(sent[i].Add(lvl.Delay)) {
			r.EarlyBySend++
			early = true
		}
		if early && len(r.EarlyKeys) < 10 {
			r.EarlyKeys = append(r.EarlyKeys, fmt.Sprintf("%d at %s due %s", i, d.At.Format("15:04:05.000000"), d.Due.Format("15:04:05.000000")))
		}
		if !d.Due.IsZero() {
			late = append(late, d.At.Sub(d.Due))
		}
	}
	for i := range l.cfg.Total {
		if l.cfg.targetOf(i) != target {
			continue
		}
		r.Expected++
		switch c := n[i]; {
		case c == 0:
			l.mu.Lock()
			atKill := target == 1 && l.atKill(i)
			l.mu.Unlock()
			if atKill {
				r.LostAtKill++
			}
			if r.Lost++; len(r.LostKeys) < 10 {
				r.LostKeys = append(r.LostKeys, strconv.Itoa(i))
			}
		case c > 1:
			r.Duplicates += c - 1
			if len(r.DupKeys) < 10 {
				r.DupKeys = append(r.DupKeys, fmt.Sprintf("%d×%d", i, c))
			}
		}
	}
	slices.Sort(late)
	if len(late) > 0 {
		r.Lateness = latency{P50: itest.Percentile(late, 50), P99: itest.Percentile(late, 99), Max: late[len(late)-1]}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for k := 1; k < len(times); k++ {
		if g := times[k].Sub(times[k-1]); g > r.LongestGap {
			r.LongestGap, r.GapFrom = g, times[k-1]
		}
	}
	return r
}

// checkStream fails the test for any message lost, early, duplicated or
// unexpected at the stream-bound target (docs/guarantees.md#guarantees).
func (r loadReport) checkStream(t *testing.T) {
	t.Helper()
	s := r.Stream
	var bad []string
	if s.Lost > 0 {
		bad = append(bad, fmt.Sprintf("%d lost, e.g. %v", s.Lost, s.LostKeys))
	}
	if s.Early+s.EarlyBySend > 0 {
		bad = append(bad, fmt.Sprintf("%d early by Delay-Due-At and %d by the send time, e.g. %v", s.Early, s.EarlyBySend, s.EarlyKeys))
	}
	if s.Duplicates > 0 {
		bad = append(bad, fmt.Sprintf("%d duplicates, e.g. %v", s.Duplicates, s.DupKeys))
	}
	if s.Unexpected > 0 {
		bad = append(bad, fmt.Sprintf("%d deliveries not sent to it", s.Unexpected))
	}
	if len(bad) > 0 {
		t.Errorf("stream target %s: %s", loadStream, strings.Join(bad, "; "))
	}
}

// checkShort checks the short-window stream-bound target (loadConfig.ShortDuplicates),
// if the load has one: it fails the test for any message lost, early or
// unexpected there, or for more duplicates than faults re-deliveries of one
// scanner window per level each, the bound docs/guarantees.md#stream-targets-and-their-duplicate-window
// states for a stream target whose duplicate window is shorter than a
// fault (a copy a hung node held in its sockets, stored when it resumed).
// It logs the duplicates as a figure.
func (r loadReport) checkShort(t *testing.T, faults, window int, table levels.Table) {
	t.Helper()
	s := r.Short
	if s == nil {
		return
	}
	var bad []string
	if s.Lost > 0 {
		bad = append(bad, fmt.Sprintf("%d lost, e.g. %v", s.Lost, s.LostKeys))
	}
	if s.Early+s.EarlyBySend > 0 {
		bad = append(bad, fmt.Sprintf("%d early by Delay-Due-At and %d by the send time, e.g. %v", s.Early, s.EarlyBySend, s.EarlyKeys))
	}
	bound := faults * table.Len() * window
	if s.Duplicates > bound {
		bad = append(bad, fmt.Sprintf("%d duplicates, more than one window of %d per level per fault (%d faults: %d), e.g. %v", s.Duplicates, window, faults, bound, s.DupKeys))
	}
	if s.Unexpected > 0 {
		bad = append(bad, fmt.Sprintf("%d deliveries not sent to it", s.Unexpected))
	}
	if len(bad) > 0 {
		t.Errorf("short-window stream target %s: %s", loadShortStream, strings.Join(bad, "; "))
	}
	t.Logf("FIGURE short-window stream target %s: %d duplicates (bound %d), e.g. %v", loadShortStream, s.Duplicates, bound, s.DupKeys)
}

// checkCore fails the test for any message lost, early or unexpected at
// the core target, or for more duplicates than faults re-deliveries of one
// scanner window per level each (docs/guarantees.md#at-least-once: a core subscriber
// sees at most the deliveries past the last committed offset again). The
// one loss it allows is of messages due at a node's SIGKILL
// ([load.nodeKilled]), up to the same bound: core NATS forwards a message
// between nodes after it answered the publisher's flush
// (docs/guarantees.md#a-core-delivery-between-nodes-at-a-node-kill).
func (r loadReport) checkCore(t *testing.T, faults, window int, table levels.Table) {
	t.Helper()
	c := r.Core
	var bad []string
	if c.Lost > c.LostAtKill {
		bad = append(bad, fmt.Sprintf("%d lost (%d of them due at a node kill), e.g. %v", c.Lost, c.LostAtKill, c.LostKeys))
	} else if bound := faults * table.Len() * window; c.LostAtKill > bound {
		bad = append(bad, fmt.Sprintf("%d lost at node kills, more than one window of %d per level per fault (%d faults: %d), e.g. %v", c.LostAtKill, window, faults, bound, c.LostKeys))
	} else if c.LostAtKill > 0 {
		t.Logf("core target: %d messages due at a node's SIGKILL lost with it (README \"Non-guarantees\"), e.g. %v", c.LostAtKill, c.LostKeys)
	}
	if c.Early+c.EarlyBySend > 0 {
		bad = append(bad, fmt.Sprintf("%d early by Delay-Due-At and %d by the send time, e.g. %v", c.Early, c.EarlyBySend, c.EarlyKeys))
	}
	if bound := faults * table.Len() * window; c.Duplicates > bound {
		bad = append(bad, fmt.Sprintf("%d duplicates, more than one window of %d per level per fault (%d faults: %d), e.g. %v", c.Duplicates, window, faults, bound, c.DupKeys))
	}
	if c.Unexpected > 0 {
		bad = append(bad, fmt.Sprintf("%d deliveries not sent to it", c.Unexpected))
	}
	if len(bad) > 0 {
		t.Errorf("core target %s.>: %s", loadCoreSubject, strings.Join(bad, "; "))
	}
}
