package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// levelStats is one row of stats.
type levelStats struct {
	Index   *int   `json:"index"` // null: a level stream not in the table
	Delay   string `json:"delay"`
	Stream  string `json:"stream"`
	Exists  bool   `json:"exists"`
	InTable bool   `json:"in_table"`
	// Precision: a precision level (see delayctl levels).
	Precision bool `json:"precision,omitempty"`
	// Pending counts the level stream's sequences past the committed offset, less the cancelled ones the level's
	// owner reports (Cancelled).
	Pending uint64 `json:"pending"`
	// Cancelled counts the level's cancelled messages past the committed offset: still in the level stream
	// (tombstoned, not yet passed), never delivered, not in Pending. From the stats API of the level's owner;
	// null when no delayd process answered as its owner (Pending then may count them). The owner lists up to
	// 64 of their sequences (deliver.StatsCancelledSeqsMax): with more, DueNow and OldestDue may count a
	// cancelled one.
	Cancelled *uint64 `json:"cancelled"`
	// DueNow counts the pending messages whose level wait is over (store time + the level's delay <= now).
	DueNow uint64 `json:"due_now"`
	// OldestDue is the delivery due (Delay-Due-At) of the level's head, its oldest pending message that is not
	// cancelled: when it is delivered to its target. For a cascading message (Delay-Duration, Delay-Deliver-At)
	// that is not the end of its wait at this level, which is HandOffAt. Omitted when nothing is pending.
	OldestDue *time.Time `json:"oldest_due,omitempty"`
	// HandOffAt is when the level hands its head on: OldestDue, or for a cascading message the end of its wait
	// at this level, when it moves on to its next level. Omitted when nothing is pending.
	HandOffAt *time.Time `json:"hand_off_at,omitempty"`
	// BehindSeconds is now - HandOffAt when that is positive: how long the head has waited past the time the level
	// should have handed it on (its lateness at this level); 0 when it is not due yet. Omitted when nothing is
	// pending.
	BehindSeconds *float64 `json:"behind_seconds,omitempty"`
	// LastOffset is the committed offset: the last delivered sequence.
	LastOffset uint64 `json:"last_offset"`
	// OffsetCommitted is false when DELAYD_OFFSETS holds no offset for the stream yet.
	OffsetCommitted bool `json:"offset_committed"`
	// Delivered and DeadLettered are the delayd process's counters since it started; null when unknown.
	Delivered    *uint64 `json:"delivered"`
	DeadLettered *uint64 `json:"dead_lettered"`
	// OwnerPID and OwnerEpoch name the delayd process that owns (scans) the level now, and its lease epoch;
	// omitted when none answered as its owner.
	OwnerPID    *int   `json:"owner_pid,omitempty"`
	OwnerEpoch  uint64 `json:"owner_epoch,omitempty"`
	OwnerHolder string `json:"owner_holder,omitempty"`
	// NoOwner is true when delayd processes answered but none of them owns (scans) the level now: its owner
	// died and another has not taken its lease yet (DELAYD_LEASE_TTL), or it does not answer. Delivered and
	// DeadLettered are then null.
	NoOwner bool `json:"no_owner,omitempty"`
}

// statsReport is the output of stats.
type statsReport struct {
	// Time is "now" for due_now and behind_seconds: the server's time, when it says.
	Time   time.Time    `json:"time"`
	Levels []levelStats `json:"levels"`
	// DLQMessages is how many dead letters DELAYD_DLQ holds.
	DLQMessages uint64 `json:"dlq_messages"`
	// Counters is one delayd process's reply on delayd.api.stats: the router's owner's when several replicas
	// answered (else the first); null when no delayd answered.
	Counters *deliver.StatsReply `json:"counters"`
	// CountersUnknown says why Counters is null.
	CountersUnknown string `json:"counters_unknown,omitempty"`
	// Replicas holds every delayd process's reply, sorted by PID then holder; empty when none answered.
	Replicas []deliver.StatsReply `json:"replicas"`
}

func (a *app) statsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Per-level stats: pending, due now, oldest due, offset, delivered, dead-lettered",
		Long: `stats prints one row per level stream:

  PENDING     level-stream messages past the committed offset, cancelled ones not counted
  CANCELLED   cancelled messages still in the level stream (tombstoned, not passed yet): never delivered;
              from the level owner's stats API, "?" when no delayd answers as its owner
  DUE NOW     of the pending ones, those whose wait at this level is over (store time + the level's delay <= now)
  OLDEST DUE  the delivery due (Delay-Due-At) of the level's head, its oldest pending message: when it is
              delivered to its target. A cascading message (Delay-Duration, Delay-Deliver-At) waits at a level
              only until its next hop; OLDEST DUE is still its delivery due, not the hop
  BEHIND      the head's lateness at this level: how long past the time the level should have handed it on
              (delivered it, or moved a cascading message on) it still waits; "-" when nothing is overdue
  OFFSET      the committed offset (DELAYD_OFFSETS): the last delivered sequence; "-" if none was committed yet
  DELIVERED, DEAD-LETTERED
              the counters since it started of the delayd process that owns the level (holds its lease),
              from its stats API (delayd.api.stats); "?" when no delayd answers
  OWNER       with several delayd processes (replicas): the owner's pid and lease epoch; "none answering"
              for a level no answering process owns now (its counters are then ?)

Every delayd process answers the stats API; stats gathers the replies to one request until no more come
for a quarter of a second, and prints one line per process: its pid, lease holder id, counters, and the
leases it holds with their epochs; with ingress partitions (DELAYD_INGRESS_PARTITIONS) also a line per
router in it: its lease router.<i>, whether it routes now, its epoch and counters. --json prints them all under "replicas".

It costs O(levels) requests, whatever the backlog: one stream list, one offset read and at most five direct
gets per level (the head, past up to three epoch markers, and the first message not due), one request to the
stats API. "Now" is the server's time.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := a.requireIngress(cmd.Context()); err != nil {
				return err
			}
			rep, err := a.collectStats(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, rep)
			}
			return printStats(a.stdout, rep)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// collectStats reads every level's stats: O(levels) requests, never a scan of messages.
func (a *app) collectStats(ctx context.Context) (*statsReport, error) {
	rows, now, err := a.levelRows(ctx)
	if err != nil {
		return nil, err
	}
	rep := &statsReport{Time: now.UTC()}
	replicas, why := a.gatherStats(ctx)
	rep.Replicas, rep.CountersUnknown = replicas, why
	counters := mainReplica(replicas)
	rep.Counters = counters
	byStream := ownersView(replicas)

	var kv jetstream.KeyValue
	if len(rows) > 0 {
		rctx, cancel := a.reqCtx(ctx)
		kv, err = a.js.KeyValue(rctx, offsets.Bucket)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("offsets bucket %s: %w", offsets.Bucket, err)
		}
	}
	for _, r := range rows {
		s := levelStats{Index: r.Index, Delay: levels.FormatDuration(r.Delay), Stream: r.Stream, Exists: r.Exists, InTable: r.InTable, Precision: r.Precision}
		if c, ok := byStream[r.Stream]; ok {
			s.Delivered, s.DeadLettered = &c.Delivered, &c.DeadLettered
			if c.Owner {
				s.OwnerPID, s.OwnerEpoch, s.OwnerHolder = &c.PID, c.Epoch, c.Holder
			}
		} else if r.Exists {
			// No process that answered scans it now (its owner died and
			// its lease is not taken yet, or it does not answer): its
			// counters are unknown, not 0.
			s.NoOwner = len(replicas) > 0
		}
		if r.Exists {
			var cancelled []uint64 // the owner's cancelled sequences, when it lists them all
			if c, ok := byStream[r.Stream]; ok && c.Owner {
				n := c.Cancelled
				s.Cancelled = &n
				if n <= uint64(len(c.CancelledSeqs)) {
					cancelled = c.CancelledSeqs
				}
			}
			if err := a.fillLevel(ctx, kv, r, now, cancelled, &s); err != nil {
				return nil, err
			}
		}
		rep.Levels = append(rep.Levels, s)
	}
	if _, info, err := a.stream(ctx, deliver.DLQStream); err == nil {
		rep.DLQMessages = info.State.Msgs
	}
	return rep, nil
}

// statsHeadTries is how many messages fillLevel reads at most to find a level's head: epoch markers (one per
// router term, never delivered) are passed over.
const statsHeadTries = 4

// fillLevel reads one level's offset and, if anything is pending, its head's due times and the first message not
// due yet: one KV get and at most statsHeadTries+1 direct gets. cancelled lists the sequences of the level's
// cancelled messages past the offset, ascending, as its owner reports them (nil when unknown or too many to list):
// they are neither the head nor due now; s.Cancelled, when known, is not pending.
func (a *app) fillLevel(ctx context.Context, kv jetstream.KeyValue, r levelRow, now time.Time, cancelled []uint64, s *levelStats) error {
	st := r.info.State
	// The scanner's own reading of a missing or impossible offset: the stream's first sequence - 1.
	base := st.FirstSeq - min(st.FirstSeq, 1)
	if kv != nil {
		rctx, cancel := a.reqCtx(ctx)
		e, err := kv.Get(rctx, r.Stream)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("offset of %s: %w", r.Stream, err)
		default:
			if off, perr := strconv.ParseUint(string(e.Value()), 10, 64); perr == nil {
				s.LastOffset, s.OffsetCommitted = off, true
				if off >= base && off <= st.LastSeq {
					base = off
				}
			}
		}
	}
	if st.Msgs == 0 || st.LastSeq <= base {
		return nil
	}
	all := st.LastSeq - base
	var nCancelled uint64
	if s.Cancelled != nil {
		nCancelled = min(*s.Cancelled, all)
	}
	s.Pending = all - nCancelled
	if s.Pending == 0 {
		return nil
	}
	isCancelled := func(seq uint64) bool { _, found := slices.BinarySearch(cancelled, seq); return found }

	// The head: the first message past the offset that is neither cancelled nor an epoch marker.
	for seq, tries := base+1, 0; seq <= st.LastSeq && tries < statsHeadTries; tries++ {
		for isCancelled(seq) {
			seq++
		}
		head, err := a.directGet(ctx, r.Stream, fmt.Sprintf(`{"seq":%d,"batch":1}`, seq))
		if err != nil {
			return err
		}
		if head == nil {
			break
		}
		got, _ := strconv.ParseUint(head.Header.Get(jetstream.SequenceHeader), 10, 64)
		if isCancelled(got) {
			seq = got + 1
			continue
		}
		handOff, ok := deliver.LevelDue(head.Header)
		if !ok {
			seq = max(got, seq) + 1 // an epoch marker, or a message without due times
			continue
		}
		due, ok := deliver.DeliveryDue(head.Header)
		if !ok {
			due = handOff
		}
		behind := max(now.Sub(handOff).Seconds(), 0)
		s.OldestDue, s.HandOffAt, s.BehindSeconds = &due, &handOff, &behind
		break
	}
	// The first message stored after now - delay is the first whose wait is not over.
	since, _ := json.Marshal(now.Add(-r.Delay))
	first, err := a.directGet(ctx, r.Stream, fmt.Sprintf(`{"start_time":%s,"batch":1}`, since))
	if err != nil {
		return err
	}
	due := all // every sequence past the offset, cancelled ones included
	if first != nil {
		if seq, err := strconv.ParseUint(first.Header.Get(jetstream.SequenceHeader), 10, 64); err == nil {
			due = min(all, max(seq, base+1)-(base+1))
		}
	}
	// Less the cancelled ones among them: each listed one below the boundary, or, unlisted, as many as fit.
	boundary := base + due // the last sequence whose wait is over
	var dueCancelled uint64
	if cancelled != nil {
		i, _ := slices.BinarySearch(cancelled, boundary+1)
		dueCancelled = uint64(i)
	} else {
		dueCancelled = sat(nCancelled, all-due) // unlisted: those that cannot all be among the not-due ones
	}
	s.DueNow = min(s.Pending, due-min(due, dueCancelled))
	return nil
}

func sat(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// directGet sends one direct-get request to stream and returns the message, or nil when the stream holds none
// that matches. A stored message is told from a status by its Nats-Sequence header, never by a Status header,
// which a publisher could set.
func (a *app) directGet(ctx context.Context, stream, req string) (*nats.Msg, error) {
	rctx, cancel := a.reqCtx(ctx)
	defer cancel()
	m, err := a.nc.RequestWithContext(rctx, "$JS.API.DIRECT.GET."+stream, []byte(req))
	if err != nil {
		return nil, fmt.Errorf("direct get from %s: %w", stream, err)
	}
	if m.Header.Get(jetstream.SequenceHeader) != "" {
		return m, nil
	}
	if m.Header.Get("Status") == "404" {
		return nil, nil
	}
	return nil, fmt.Errorf("direct get from %s: status %s %s", stream, m.Header.Get("Status"), m.Header.Get("Description"))
}

// statsQuiet is how long stats waits for one more delayd process's reply after the last one.
const statsQuiet = 250 * time.Millisecond

// gatherStats asks every delayd process for its counters: one request on the stats API with a reply inbox,
// whose replies are gathered until none came for statsQuiet (or until min(--timeout, 2 s) passed). It returns
// them sorted by PID, then holder id; none and the reason when no delayd answers.
func (a *app) gatherStats(ctx context.Context) ([]deliver.StatsReply, string) {
	inbox := a.nc.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := a.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Sprintf("no answer on %s: subscribe %s: %v", contract.StatsSubject, inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := a.nc.PublishRequest(contract.StatsSubject, inbox, nil); err != nil {
		return nil, fmt.Sprintf("no answer on %s: %v", contract.StatsSubject, err)
	}
	limit := time.NewTimer(min(a.timeout, 2*time.Second))
	defer limit.Stop()
	quiet := time.NewTimer(time.Hour) // armed by the first reply
	defer quiet.Stop()
	var (
		out []deliver.StatsReply
		bad string
	)
gather:
	for {
		select {
		case m := <-ch:
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				// The server's "no responders": nobody subscribes to the stats API.
				if len(out) == 0 {
					return nil, "no delayd answered on " + contract.StatsSubject + " (not running, or a delayd without the stats API)"
				}
				continue
			}
			var r deliver.StatsReply
			if err := json.Unmarshal(m.Data, &r); err != nil {
				bad = fmt.Sprintf("bad reply on %s: %v", contract.StatsSubject, err)
			} else {
				out = append(out, r)
			}
			quiet.Reset(statsQuiet)
		case <-quiet.C:
			break gather
		case <-limit.C:
			break gather
		case <-ctx.Done():
			break gather
		}
	}
	if len(out) == 0 {
		if bad != "" {
			return nil, bad
		}
		return nil, fmt.Sprintf("no answer on %s within %s", contract.StatsSubject, min(a.timeout, 2*time.Second))
	}
	slices.SortFunc(out, func(x, y deliver.StatsReply) int {
		return cmp.Or(cmp.Compare(x.PID, y.PID), strings.Compare(x.Holder, y.Holder))
	})
	return out, ""
}

// mainReplica returns the reply of the process that holds the router lease, else the first; nil if none.
func mainReplica(replicas []deliver.StatsReply) *deliver.StatsReply {
	for i := range replicas {
		if replicas[i].RouterOwner {
			return &replicas[i]
		}
	}
	if len(replicas) > 0 {
		return &replicas[0]
	}
	return nil
}

// ownedLevel is a level stream's numbers from the process that owns it.
type ownedLevel struct {
	deliver.LevelStats
	PID    int
	Holder string
}

// ownersView returns each level stream's numbers from the process that owns it (the highest epoch if two claim
// it, as during a failover); a level no answering process owns now is not in it (its counters are unknown).
func ownersView(replicas []deliver.StatsReply) map[string]ownedLevel {
	out := map[string]ownedLevel{}
	for _, r := range replicas {
		for _, l := range r.Levels {
			if cur, ok := out[l.Stream]; l.Owner && (!ok || !cur.Owner || l.Epoch > cur.Epoch) {
				out[l.Stream] = ownedLevel{l, r.PID, r.Holder}
			}
		}
	}
	return out
}

// printStats prints rep as a table.
func printStats(w io.Writer, rep *statsReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	many := len(rep.Replicas) > 1 // the OWNER column: with several processes, or a level none of them owns
	for _, s := range rep.Levels {
		many = many || s.NoOwner
	}
	head := "LEVEL\tDELAY\tSTREAM\tPENDING\tCANCELLED\tDUE NOW\tOLDEST DUE\tBEHIND\tOFFSET\tDELIVERED\tDEAD-LETTERED"
	if many {
		head += "\tOWNER"
	}
	fmt.Fprintln(tw, head)
	quiet := 0 // precision levels holding nothing: not shown in the table
	for _, s := range rep.Levels {
		if s.Precision && s.Pending == 0 {
			quiet++
			continue
		}
		idx := "-"
		if s.Index != nil {
			idx = strconv.Itoa(*s.Index)
		} else if s.Precision {
			idx = "p"
		}
		if !s.Exists {
			fmt.Fprintf(tw, "%s\t%s\t%s\t(stream missing)\t\t\t\t\t\t\t\n", idx, s.Delay, s.Stream)
			continue
		}
		oldest, behind := "-", "-"
		if s.OldestDue != nil {
			oldest = s.OldestDue.UTC().Format(time.RFC3339)
			behind = behindText(time.Duration(*s.BehindSeconds * float64(time.Second)))
		}
		offset := "-"
		if s.OffsetCommitted {
			offset = strconv.FormatUint(s.LastOffset, 10)
		}
		delay := s.Delay
		if s.Index != nil && *s.Index == 0 {
			delay += " (at once)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s", idx, delay, s.Stream, s.Pending, counter(s.Cancelled),
			s.DueNow, oldest, behind, offset, counter(s.Delivered), counter(s.DeadLettered))
		if many {
			owner := "-"
			if s.NoOwner {
				owner = "none answering"
			}
			if s.OwnerPID != nil {
				owner = fmt.Sprintf("pid %d epoch %d", *s.OwnerPID, s.OwnerEpoch)
			}
			fmt.Fprintf(tw, "\t%s", owner)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if quiet > 0 {
		fmt.Fprintf(w, "%d empty precision levels not shown (--json lists them).\n", quiet)
	}
	fmt.Fprintf(w, "DELAYD_DLQ holds %d dead letter(s).\n", rep.DLQMessages)
	if len(rep.Replicas) == 0 {
		fmt.Fprintf(w, "DELIVERED and DEAD-LETTERED unknown (?): %s.\n", rep.CountersUnknown)
		return nil
	}
	if len(rep.Replicas) > 1 {
		fmt.Fprintf(w, "%d delayd processes (replicas) answered; DELIVERED and DEAD-LETTERED are each level's owner's.\n", len(rep.Replicas))
	}
	for _, c := range rep.Replicas {
		fmt.Fprintf(w, "delayd (pid %d, up %s, ready %t): routed %d, clamped %d, dead letters by reason: level %d, target %d, size %d, undeliverable %d.\n",
			c.PID, rep.Time.Sub(c.Started).Round(time.Second), c.Ready, c.Routed, c.Clamped,
			c.DeadLetters[deliver.ReasonLevel], c.DeadLetters[deliver.ReasonTarget], c.DeadLetters[deliver.ReasonSize], c.DeadLetters[deliver.ReasonUndeliverable])
		fmt.Fprintf(w, "  holder %s holds: %s\n", cmp.Or(c.Holder, "?"), heldLeases(c))
		for _, r := range c.Routers { // with ingress partitions: one line per router
			state := "not routing"
			if r.Owner {
				state = "routing"
			}
			fmt.Fprintf(w, "  %s (ingress partition %d): %s, epoch %d, routed %d, clamped %d, dead-lettered %d\n",
				r.Lease, r.IngressPartition, state, r.Epoch, r.Routed, r.Clamped, r.DeadLettered)
		}
	}
	return nil
}

// heldLeases lists the leases a process holds with their epochs, "router (epoch 3), DELAYD_5S (epoch 2)", or
// "no lease".
func heldLeases(c deliver.StatsReply) string {
	var held []string
	for _, l := range c.Leases {
		if l.Held {
			held = append(held, fmt.Sprintf("%s (epoch %d)", strings.TrimPrefix(l.Key, "level."), l.Epoch))
		}
	}
	if len(held) == 0 {
		return "no lease"
	}
	return strings.Join(held, ", ")
}

// behindText formats a head's lateness: "1.5s", "2m58s", or "-" when it is not overdue (d <= 0).
func behindText(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

func counter(p *uint64) string {
	if p == nil {
		return "?"
	}
	return strconv.FormatUint(*p, 10)
}

func (a *app) watchCmd() *cobra.Command {
	var (
		interval time.Duration
		count    int
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Live per-level stats, refreshed every --interval",
		Long: `watch prints the stats table (see 'delayctl stats --help') every --interval. On a terminal it
redraws in place; otherwise (a pipe, a file) it prints each table after a time line. --count N stops
after N tables (0: until interrupted). A failed refresh prints its error and watch carries on.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return withCode(exitUsage, "--interval %s: must be positive", interval)
			}
			if count < 0 {
				return withCode(exitUsage, "--count %d: must be >= 0", count)
			}
			ctx := cmd.Context()
			if _, err := a.requireIngress(ctx); err != nil {
				return err
			}
			tty := isTerminal(a.stdout)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 1; ; n++ {
				rep, err := a.collectStats(ctx)
				if ctx.Err() != nil {
					return nil // interrupted: a clean exit
				}
				if tty {
					fmt.Fprint(a.stdout, "\x1b[H\x1b[2J")
				}
				fmt.Fprintf(a.stdout, "delayd stats at %s (every %s, Ctrl-C to stop)\n", time.Now().UTC().Format(time.RFC3339), interval)
				if err != nil {
					fmt.Fprintf(a.stdout, "error: %v\n", err)
				} else if err := printStats(a.stdout, rep); err != nil {
					return err
				}
				if !tty {
					fmt.Fprintln(a.stdout)
				}
				if count > 0 && n >= count {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until interrupted)")
	return cmd
}

// isTerminal reports whether w is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
