package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// levelRow is one level stream (or partition) of the overview.
type levelRow struct {
	Stream string
	Delay  time.Duration
	// Pending counts the stream's messages past the committed offset, less the cancelled ones its owner reports;
	// DueNow those whose wait at this level is over; NextDue the delivery due of its head (zero: none pending).
	Pending, Cancelled, DueNow uint64
	NextDue                    time.Time
	// Owner is "pid <pid> (<holder>) epoch <n>", or "" when no answering delayd owns it.
	Owner string
}

// routerRow is one router lease and its owner.
type routerRow struct {
	Lease, Owner string
	Epoch        uint64
	Routed       uint64
}

// overviewData is the overview page's content. Errors list what could not be read; the rest is shown.
type overviewData struct {
	Now         time.Time
	Levels      []levelRow
	Routers     []routerRow
	Replicas    []deliver.StatsReply
	DeadLetters []reasonCount
	DLQTotal    uint64
	// Targets are the targets of the first [targetsScan] pending messages by due (the list API's operator form),
	// with how many of those each has; TargetsOf is how many messages that was.
	Targets   []targetCount
	TargetsOf int
	Errors    []string
}

// targetsScan is how many of the deployment's next pending messages the overview reads for its list of targets.
const targetsScan = 200

type targetCount struct {
	Target string
	Count  int
}

type reasonCount struct {
	Reason string
	Count  uint64
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	d := c.readOverview(ctx)
	c.render(w, r, http.StatusOK, "overview.html", map[string]any{"Title": "Overview", "O": d, "Refresh": int(c.cfg.Refresh.Seconds())})
}

// readOverview reads the whole deployment over NATS: the level streams' state, every delayd's stats API reply,
// the offsets and DELAYD_DLQ's subjects. It costs O(level streams) requests, never a scan of messages.
func (c *Console) readOverview(ctx context.Context) *overviewData {
	d := &overviewData{}
	fail := func(what string, err error) { d.Errors = append(d.Errors, fmt.Sprintf("%s: %v", what, err)) }
	infos := map[string]*jetstream.StreamInfo{}
	list := c.js.ListStreams(ctx, jetstream.WithStreamListSubject(contract.InternalPrefix+".level.>"))
	for info := range list.Info() {
		if _, _, ok := levels.ParseStream(info.Config.Name); ok {
			infos[info.Config.Name] = info
			if d.Now.IsZero() {
				d.Now = info.TimeStamp // the server's time, as delayctl stats reads it
			}
		}
	}
	if err := list.Err(); err != nil {
		fail("list level streams", err)
	}
	if d.Now.IsZero() {
		d.Now = time.Now()
	}
	d.Now = d.Now.UTC()
	d.Replicas = c.gatherStats(ctx)
	if len(d.Replicas) == 0 {
		d.Errors = append(d.Errors, "no delayd answered on "+contract.StatsSubject+": owners and counters unknown")
	}
	d.Routers = routers(d.Replicas)
	owners := ownersView(d.Replicas)

	kv, err := c.js.KeyValue(ctx, offsets.Bucket)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		fail("offsets bucket "+offsets.Bucket, err)
	}
	for name, info := range infos {
		delay, _, _ := levels.ParseStream(name)
		row := levelRow{Stream: name, Delay: delay}
		o, owned := owners[name]
		if owned {
			row.Owner = fmt.Sprintf("pid %d (%s) epoch %d", o.pid, o.holder, o.Epoch)
		}
		if err := c.fillLevel(ctx, kv, info, o, owned, d.Now, &row); err != nil {
			fail(name, err)
		}
		d.Levels = append(d.Levels, row)
	}
	slices.SortFunc(d.Levels, func(a, b levelRow) int {
		return cmp.Or(cmp.Compare(a.Delay, b.Delay), strings.Compare(a.Stream, b.Stream))
	})

	if page, err := delayd.ListPendingAny(ctx, c.nc, "", delayd.WithLimit(targetsScan)); err == nil {
		counts := map[string]int{}
		for _, m := range page.Items {
			counts[m.Target]++
		}
		for t, n := range counts {
			d.Targets = append(d.Targets, targetCount{t, n})
		}
		slices.SortFunc(d.Targets, func(a, b targetCount) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.Target, b.Target)) })
		d.TargetsOf = len(page.Items)
	} else {
		fail("list pending messages", err)
	}
	if s, err := c.js.Stream(ctx, deliver.DLQStream); err == nil {
		if info, err := s.Info(ctx, jetstream.WithSubjectFilter(contract.DLQSubjectPrefix+">")); err == nil {
			d.DLQTotal = info.State.Msgs
			for subj, n := range info.State.Subjects {
				d.DeadLetters = append(d.DeadLetters, reasonCount{strings.TrimPrefix(subj, contract.DLQSubjectPrefix), n})
			}
			slices.SortFunc(d.DeadLetters, func(a, b reasonCount) int { return strings.Compare(a.Reason, b.Reason) })
		} else {
			fail(deliver.DLQStream, err)
		}
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		fail(deliver.DLQStream, err)
	}
	return d
}

// headTries is how many messages fillLevel reads at most to find a level's head past epoch markers.
const headTries = 4

// fillLevel sets row's pending, due-now and next-due counts, as delayctl stats reads them (cmd/delayctl/stats.go):
// the committed offset (the owner's, else DELAYD_OFFSETS), the head's Delay-Due-At, and the first message stored
// after now - the level's delay.
func (c *Console) fillLevel(ctx context.Context, kv jetstream.KeyValue, info *jetstream.StreamInfo, o ownedLevel, owned bool, now time.Time, row *levelRow) error {
	st := info.State
	base := st.FirstSeq - min(st.FirstSeq, 1)
	switch {
	case owned:
		if o.Offset >= base && o.Offset <= st.LastSeq {
			base = o.Offset
		}
	case kv != nil:
		e, err := kv.Get(ctx, row.Stream)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("offset: %w", err)
		}
		if err == nil {
			if off, perr := strconv.ParseUint(string(e.Value()), 10, 64); perr == nil && off >= base && off <= st.LastSeq {
				base = off
			}
		}
	}
	if st.Msgs == 0 || st.LastSeq <= base {
		return nil
	}
	all := st.LastSeq - base
	row.Cancelled = min(o.Cancelled, all)
	row.Pending = all - row.Cancelled
	if row.Pending == 0 {
		return nil
	}
	cancelled := func(seq uint64) bool { _, found := slices.BinarySearch(o.CancelledSeqs, seq); return found }
	for seq, tries := base+1, 0; seq <= st.LastSeq && tries < headTries; tries++ {
		for cancelled(seq) {
			seq++
		}
		head, err := c.directGet(ctx, row.Stream, fmt.Sprintf(`{"seq":%d,"batch":1}`, seq))
		if err != nil || head == nil {
			return err
		}
		got, _ := strconv.ParseUint(head.Header.Get(jetstream.SequenceHeader), 10, 64)
		if _, ok := deliver.LevelDue(head.Header); !ok || cancelled(got) {
			seq = max(got, seq) + 1 // an epoch marker, or cancelled
			continue
		}
		due, ok := deliver.DeliveryDue(head.Header)
		if !ok {
			due, _ = deliver.LevelDue(head.Header)
		}
		row.NextDue = due.UTC()
		break
	}
	since, _ := json.Marshal(now.Add(-row.Delay))
	first, err := c.directGet(ctx, row.Stream, fmt.Sprintf(`{"start_time":%s,"batch":1}`, since))
	if err != nil {
		return err
	}
	due := all
	if first != nil {
		if seq, err := strconv.ParseUint(first.Header.Get(jetstream.SequenceHeader), 10, 64); err == nil {
			due = min(all, max(seq, base+1)-(base+1))
		}
	}
	// Less the cancelled ones the owner lists below the boundary (unlisted ones, past 64, may be counted).
	i, _ := slices.BinarySearch(o.CancelledSeqs, base+due+1)
	row.DueNow = min(row.Pending, due-min(due, uint64(i)))
	return nil
}

// directGet sends one direct-get request to stream; nil when it holds no message that matches. A stored message is
// told from a status by its Nats-Sequence header, never by a Status header, which a publisher could set.
func (c *Console) directGet(ctx context.Context, stream, req string) (*nats.Msg, error) {
	m, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, []byte(req))
	if err != nil {
		return nil, fmt.Errorf("direct get: %w", err)
	}
	if m.Header.Get(jetstream.SequenceHeader) != "" {
		return m, nil
	}
	if m.Header.Get("Status") == "404" {
		return nil, nil
	}
	return nil, fmt.Errorf("direct get: status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
}

// statsQuiet is how long gatherStats waits for one more delayd's reply after the last one (delayctl stats' wait).
const statsQuiet = 250 * time.Millisecond

// gatherStats asks every delayd process for its stats API reply: one request with a reply inbox, gathered until
// none came for statsQuiet or ctx ends; sorted by PID, then holder.
func (c *Console) gatherStats(ctx context.Context) []deliver.StatsReply {
	inbox := c.nc.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := c.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.PublishRequest(contract.StatsSubject, inbox, nil); err != nil {
		return nil
	}
	quiet := time.NewTimer(min(2*time.Second, c.cfg.RequestTimeout)) // the first reply's wait; then statsQuiet
	defer quiet.Stop()
	var out []deliver.StatsReply
	for {
		select {
		case m := <-ch:
			var r deliver.StatsReply
			if len(m.Data) > 0 && json.Unmarshal(m.Data, &r) == nil {
				out = append(out, r)
			}
			quiet.Reset(statsQuiet)
		case <-quiet.C:
			slices.SortFunc(out, func(x, y deliver.StatsReply) int {
				return cmp.Or(cmp.Compare(x.PID, y.PID), strings.Compare(x.Holder, y.Holder))
			})
			return out
		case <-ctx.Done():
			return out
		}
	}
}

// ownedLevel is a level stream's numbers from the process that owns it.
type ownedLevel struct {
	deliver.LevelStats
	pid    int
	holder string
}

// ownersView returns each level stream's numbers from its owner (the highest epoch if two claim it, as during a
// failover); a level no answering process owns is absent.
func ownersView(replicas []deliver.StatsReply) map[string]ownedLevel {
	out := map[string]ownedLevel{}
	for _, r := range replicas {
		for _, l := range r.Levels {
			if cur, ok := out[l.Stream]; l.Owner && (!ok || l.Epoch > cur.Epoch) {
				out[l.Stream] = ownedLevel{l, r.PID, r.Holder}
			}
		}
	}
	return out
}

// routers returns the router leases and their owners: "router", or one "router.<i>" per ingress partition.
func routers(replicas []deliver.StatsReply) []routerRow {
	byLease := map[string]routerRow{}
	for _, r := range replicas {
		who := fmt.Sprintf("pid %d (%s)", r.PID, r.Holder)
		if len(r.Routers) == 0 {
			if cur, ok := byLease["router"]; r.RouterOwner && (!ok || r.RouterEpoch > cur.Epoch) {
				byLease["router"] = routerRow{Lease: "router", Owner: who, Epoch: r.RouterEpoch, Routed: r.Routed}
			}
			continue
		}
		for _, p := range r.Routers {
			if cur, ok := byLease[p.Lease]; p.Owner && (!ok || p.Epoch > cur.Epoch) {
				byLease[p.Lease] = routerRow{Lease: p.Lease, Owner: who, Epoch: p.Epoch, Routed: p.Routed}
			}
		}
	}
	out := make([]routerRow, 0, len(byLease))
	for _, v := range byLease {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b routerRow) int { return strings.Compare(a.Lease, b.Lease) })
	return out
}
