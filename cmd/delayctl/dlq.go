package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
)

// letter is one dead letter of DELAYD_DLQ.
type letter struct {
	Seq     uint64      `json:"seq"`
	Time    time.Time   `json:"time"`
	Reason  string      `json:"reason"`
	Subject string      `json:"subject"` // Delay-Subject: where it was published to, or to be delivered to
	Error   string      `json:"error"`   // Delay-Error
	MsgID   string      `json:"msg_id,omitempty"`
	Size    int         `json:"size"` // payload bytes
	Header  nats.Header `json:"headers"`
	data    []byte
}

func newLetter(seq uint64, subject string, h nats.Header, data []byte, t time.Time) letter {
	return letter{
		Seq: seq, Time: t.UTC(), Reason: strings.TrimPrefix(subject, contract.DLQSubjectPrefix),
		Subject: h.Get(contract.HeaderSubject), Error: h.Get(contract.HeaderError), MsgID: h.Get(contract.HeaderMsgID),
		Size: len(data), Header: h, data: data,
	}
}

func (a *app) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List and replay dead letters (DELAYD_DLQ)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withCode(exitUsage, "dlq needs a subcommand: ls or replay")
		},
	}
	cmd.AddCommand(a.dlqLsCmd(), a.dlqReplayCmd())
	return cmd
}

// reasonFilter returns the DLQ subject for reason ("" for every reason).
func reasonFilter(reason string) (string, error) {
	if reason == "" {
		return contract.DLQSubjectPrefix + ">", nil
	}
	for _, r := range deliver.Reasons {
		if r == reason {
			return contract.DLQSubjectPrefix + reason, nil
		}
	}
	return "", withCode(exitUsage, "--reason %q: want one of %s", reason, strings.Join(deliver.Reasons, ", "))
}

// readLetters calls fn for the dead letters on filter in sequence order, up to sequence last, until fn returns
// false. It reads through an ordered consumer: no per-message request.
func (a *app) readLetters(ctx context.Context, filter string, last uint64, fn func(letter) bool) error {
	rctx, cancel := a.reqCtx(ctx)
	cons, err := a.js.OrderedConsumer(rctx, deliver.DLQStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	cancel()
	if err != nil {
		return fmt.Errorf("read %s: %w", deliver.DLQStream, err)
	}
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return fmt.Errorf("read %s: %w", deliver.DLQStream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read %s: %w", deliver.DLQStream, err)
			}
			if md.Sequence.Stream > last {
				return nil
			}
			if !fn(newLetter(md.Sequence.Stream, m.Subject(), m.Headers(), m.Data(), md.Timestamp)) {
				return nil
			}
			if md.NumPending == 0 || md.Sequence.Stream == last {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read %s: %w", deliver.DLQStream, err)
		}
		if n == 0 {
			return nil // nothing more on the filter
		}
	}
}

func (a *app) dlqLsCmd() *cobra.Command {
	var (
		asJSON bool
		limit  int
		reason string
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters: sequence, time, reason, Delay-Subject, size, Delay-Error",
		Long: `ls lists dead letters, oldest first: the DELAYD_DLQ sequence (the id dlq replay takes), when it
was dead-lettered, the reason (level, target, size, undeliverable: the subject's last token), the
Delay-Subject it was published or to be delivered to, the payload size and Delay-Error.
--json adds each letter's headers.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return withCode(exitUsage, "--limit %d: must be >= 0", limit)
			}
			filter, err := reasonFilter(reason)
			if err != nil {
				return err
			}
			if _, err := a.requireIngress(cmd.Context()); err != nil {
				return err
			}
			_, info, err := a.stream(cmd.Context(), deliver.DLQStream)
			if err != nil {
				return err
			}
			letters := []letter{}
			if info.State.Msgs > 0 {
				err = a.readLetters(cmd.Context(), filter, info.State.LastSeq, func(l letter) bool {
					letters = append(letters, l)
					return limit == 0 || len(letters) < limit
				})
				if err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(a.stdout, letters)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTIME\tREASON\tSUBJECT\tSIZE\tERROR")
			for _, l := range letters {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", l.Seq, l.Time.Format(time.RFC3339), l.Reason, l.Subject, l.Size, l.Error)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "%d shown; %s holds %d dead letter(s).\n", len(letters), deliver.DLQStream, info.State.Msgs)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.IntVar(&limit, "limit", 100, "list at most this many (0: all)")
	f.StringVar(&reason, "reason", "", "only this reason: level, target, size or undeliverable")
	return cmd
}

func (a *app) dlqReplayCmd() *cobra.Command {
	var (
		ids    []uint
		all    bool
		reason string
		level  int
	)
	cmd := &cobra.Command{
		Use:   "replay (--id SEQ ... | --all)",
		Short: "Send dead letters back through ingress, then delete them from DELAYD_DLQ",
		Long: `replay publishes each dead letter again to delayd's ingress stream and, after the ingress PubAck,
deletes it from DELAYD_DLQ. Fix what dead-lettered it first (the target policy, a target stream's
limits, ...): a letter delayd still refuses is dead-lettered again, as a new letter.

What is sent: the letter's payload and headers, minus Delay-Error, Delay-Subject and every Nats-*
header, to its Delay-Subject:
  - a Delay-Subject under the ingress prefix (delay.orders.close: reasons level, target, size) is
    where the publisher wrote; it is published there again, with its delay headers as they were (so
    a relative delay starts again from the replay), or --level N instead;
  - any other Delay-Subject (orders.close: reason undeliverable) is the target the message was due
    at; it is published to <prefix>.<target> with Delay-Level: 0, delivered at once (or --level N).
A letter whose target delayd would refuse anyway (wildcards, '$', under the prefix or delayd.) is
skipped and kept.

Safe to run twice. The replayed message's Nats-Msg-Id is the publisher's own (from Delay-Msg-Id),
or else delayd-replay-<DELAYD_DLQ creation time, Unix ns>-<DLQ sequence>: a replay that crashed
between the publish and the delete is dropped by the ingress duplicate window (2 min) when run again,
and a deleted letter is simply reported "not found" the second time. A letter with a publisher id
is replayed only once it is older than the ingress duplicate window: until then the original publish
holds that id and the ingress stream would drop the replay as its duplicate. If ingress drops it as a
duplicate all the same (a new message re-used the id within the window, or a replay stopped between
its publish and its delete), nothing is stored and the letter is kept and counted failed. --all replays the letters
present when it starts, never the ones it causes.

Exit code 1 if a letter was skipped or failed (it stays in DELAYD_DLQ); "not found" is not an error.`,
		Example: `  delayctl dlq replay --id 12 --id 15
  delayctl dlq replay --all --reason undeliverable`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flags := cmd.Flags()
			if (len(ids) > 0) == all {
				return withCode(exitUsage, "dlq replay needs exactly one of --id SEQ and --all")
			}
			if reason != "" && !all {
				return withCode(exitUsage, "--reason only applies with --all")
			}
			filter, err := reasonFilter(reason)
			if err != nil {
				return err
			}
			var override *int
			if flags.Changed("level") {
				if level < 0 {
					return withCode(exitUsage, "--level %d: must be >= 0", level)
				}
				override = &level
			}
			for _, id := range ids {
				if id == 0 {
					return withCode(exitUsage, "--id 0: DLQ sequences start at 1")
				}
			}
			ctx := cmd.Context()
			ingress, err := a.requireIngress(ctx)
			if err != nil {
				return err
			}
			dlq, info, err := a.stream(ctx, deliver.DLQStream)
			if err != nil {
				return err
			}
			r := &replayer{a: a, dlq: dlq, created: info.Created, window: ingress.Config.Duplicates, now: info.TimeStamp, level: override}
			if r.now.IsZero() {
				r.now = time.Now()
			}
			if all {
				if info.State.Msgs > 0 {
					err = a.readLetters(ctx, filter, info.State.LastSeq, func(l letter) bool {
						r.replay(ctx, l)
						return ctx.Err() == nil && r.fatal == nil
					})
				}
			} else {
				for _, id := range ids {
					if ctx.Err() != nil || r.fatal != nil {
						break
					}
					r.replaySeq(ctx, uint64(id))
				}
			}
			fmt.Fprintf(a.stdout, "replayed %d, not found %d, skipped %d, failed %d\n", r.replayed, r.notFound, r.skipped, r.failed)
			switch {
			case r.fatal != nil:
				return r.fatal
			case err != nil:
				return err
			case r.skipped+r.failed > 0:
				return fmt.Errorf("%d dead letter(s) not replayed (kept in %s)", r.skipped+r.failed, deliver.DLQStream)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.UintSliceVar(&ids, "id", nil, "DLQ sequence of a dead letter to replay (repeatable, or comma-separated)")
	f.BoolVar(&all, "all", false, "replay every dead letter present when replay starts")
	f.StringVar(&reason, "reason", "", "with --all: only this reason (level, target, size or undeliverable)")
	f.IntVar(&level, "level", 0, "replay with Delay-Level N instead of the letter's own delay headers")
	return cmd
}

// replayer replays dead letters and counts the outcomes.
type replayer struct {
	a       *app
	dlq     jetstream.Stream
	created time.Time     // DELAYD_DLQ's creation time, for replay ids
	window  time.Duration // the ingress stream's duplicate window
	now     time.Time     // the server's time when replay started
	level   *int          // --level

	replayed, notFound, skipped, failed int
	fatal                               error // stop: the ingress stream is gone
}

func (r *replayer) printf(format string, args ...any) { fmt.Fprintf(r.a.stdout, format+"\n", args...) }

// replaySeq replays the dead letter with DLQ sequence seq.
func (r *replayer) replaySeq(ctx context.Context, seq uint64) {
	rctx, cancel := r.a.reqCtx(ctx)
	m, err := r.dlq.GetMsg(rctx, seq)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		r.notFound++
		r.printf("%d: not found (already replayed, or no such dead letter)", seq)
		return
	case err != nil:
		r.failed++
		r.printf("%d: failed: read: %v", seq, err)
		return
	}
	r.replay(ctx, newLetter(m.Sequence, m.Subject, m.Header, m.Data, m.Time))
}

// replay publishes one dead letter to ingress and deletes it after the PubAck.
func (r *replayer) replay(ctx context.Context, l letter) {
	m, id, why := r.message(l)
	if m == nil {
		r.skipped++
		r.printf("%d: skipped: %s", l.Seq, why)
		return
	}
	rctx, cancel := r.a.reqCtx(ctx)
	ack, err := r.a.js.PublishMsg(rctx, m)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		r.fatal = withCode(exitNoStreams, "no delayd stream captures %s: is delayd running with DELAYD_PREFIX=%s? (%v)", m.Subject, r.a.cfg.Prefix, err)
		r.failed++
		return
	case err != nil:
		r.failed++
		r.printf("%d: failed: publish to %s: %v", l.Seq, m.Subject, err)
		return
	case ack.Stream != deliver.IngressStream:
		r.failed++
		r.printf("%d: failed: %s is stored by stream %s, not %s: is DELAYD_PREFIX right? (letter kept)", l.Seq, m.Subject, ack.Stream, deliver.IngressStream)
		return
	}
	note := ""
	switch {
	case ack.Duplicate && id == l.MsgID:
		// The publisher's own id: the message ingress stored with it may
		// be this letter, replayed by a run stopped before its delete, or
		// a new message that re-used the id. Nothing was stored now; the
		// letter is kept rather than lost.
		dup := &delayd.DuplicateError{ID: id, Stream: ack.Stream, Sequence: ack.Sequence, Window: r.window}
		r.failed++
		r.printf("%d: failed: %v. Letter kept: replay it after %s; if a replay stopped before its delete published it, "+
			"that delivers it twice (delete it instead: nats stream rmm %s %d)",
			l.Seq, dup, time.Now().Add(r.window).Format(time.RFC3339), deliver.DLQStream, l.Seq)
		return
	case ack.Duplicate:
		note = "; ingress already had it (an earlier replay published it)"
	}
	rctx, cancel = r.a.reqCtx(ctx)
	err = r.dlq.DeleteMsg(rctx, l.Seq)
	cancel()
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err != nil && strings.Contains(err.Error(), "no message found")) {
		// Deleted meanwhile: another replay of the same letter ran at once,
		// and its publish was this one's duplicate at ingress (or the reverse).
		r.notFound++
		r.printf("%d: replayed concurrently by another run (ingress deduped it)", l.Seq)
		return
	}
	if err != nil {
		r.failed++
		r.printf("%d: published to %s as %s, but not deleted from %s: %v (replaying it again within %s is deduped)", l.Seq, m.Subject, id, deliver.DLQStream, err, r.window)
		return
	}
	r.replayed++
	r.printf("%d: replayed to %s (Nats-Msg-Id %s)%s", l.Seq, m.Subject, id, note)
}

// message builds the ingress message replaying l, or returns nil and why it is skipped.
func (r *replayer) message(l letter) (*nats.Msg, string, string) {
	prefix := r.a.cfg.Prefix
	if l.Subject == "" {
		return nil, "", "no " + contract.HeaderSubject + " header: not a delayd dead letter"
	}
	h := nats.Header{}
	for k, v := range l.Header {
		switch {
		case strings.EqualFold(k, contract.HeaderError), strings.EqualFold(k, contract.HeaderSubject),
			strings.EqualFold(k, contract.HeaderMsgID), contract.IsInternalHeader(k),
			// A delivery's own headers (a retries dead letter carries them): delayd sets them anew.
			strings.EqualFold(k, contract.HeaderEnqueuedAt), strings.EqualFold(k, contract.HeaderDueAt), strings.EqualFold(k, contract.HeaderHops):
		default:
			h[k] = append([]string(nil), v...)
		}
	}
	subject := l.Subject
	if target, ok := strings.CutPrefix(subject, prefix+"."); ok {
		if err := contract.ValidateTarget(target, prefix); err != nil {
			return nil, "", fmt.Sprintf("target %q is still refused: %v", target, err)
		}
	} else {
		// A target the message was due at (reason undeliverable): deliver it at once.
		if err := contract.ValidateTarget(subject, prefix); err != nil {
			return nil, "", fmt.Sprintf("target %q is still refused: %v", subject, err)
		}
		subject = prefix + "." + subject
		if r.level == nil {
			zero := 0
			r.setLevel(h, zero)
		}
	}
	if r.level == nil && !hasDelay(h) {
		// No delay header (a retries dead letter, or a publisher that
		// forgot it): replayed as-is it would only be dead-lettered again.
		r.setLevel(h, 0)
	}
	if r.level != nil {
		r.setLevel(h, *r.level)
	}
	id := "delayd-replay-" + strconv.FormatInt(r.created.UnixNano(), 10) + "-" + strconv.FormatUint(l.Seq, 10)
	switch {
	case l.MsgID != "" && l.Reason == delayd.ReasonRetries:
		// The last retry's id: ingress has seen it, and the target's
		// stream too. The replay is a delivery of its own.
		id = l.MsgID + "-replay"
	case l.MsgID != "":
		if age := r.now.Sub(l.Time); age < r.window+time.Second {
			return nil, "", fmt.Sprintf("its publisher's Nats-Msg-Id %q may still be in the ingress duplicate window (%s); replay it after %s",
				l.MsgID, r.window, l.Time.Add(r.window+time.Second).Format(time.RFC3339))
		}
		id = l.MsgID
	}
	h.Set(contract.HeaderNatsMsgID, id)
	return &nats.Msg{Subject: subject, Header: h, Data: l.data}, id, ""
}

// setLevel replaces h's delay headers with Delay-Level: n.
func (r *replayer) setLevel(h nats.Header, n int) {
	for k := range h {
		if contract.IsDelayHeader(k) {
			delete(h, k)
		}
	}
	h.Set(contract.HeaderLevel, strconv.Itoa(n))
}

// hasDelay reports whether h carries one of the delay headers.
func hasDelay(h nats.Header) bool {
	for k := range h {
		if contract.IsDelayHeader(k) {
			return true
		}
	}
	return false
}
