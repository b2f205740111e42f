package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
)

func (a *app) pubCmd() *cobra.Command {
	var (
		level    int
		in       time.Duration
		at       string
		msgID    string
		mergeKey string
		headers  []string
	)
	cmd := &cobra.Command{
		Use:   "pub SUBJECT [DATA] (--level N | --in DURATION | --at TIME)",
		Short: "Publish a delayed message to SUBJECT (the target) and print its id",
		Long: `pub publishes DATA (or, without DATA or with "-", standard input) for delayed delivery to SUBJECT,
the target subject (orders.close, not delay.orders.close), through delayd's ingress stream, and waits for
its PubAck. Exactly one of:

  --level N     a level of delayd's table (0: at once; above the table: its highest level)
  --in 90s      any delay, a Go duration
  --at TIME     an RFC 3339 time, 2026-11-30T08:00:00Z (in the past: at once)

It prints the message's id on standard output, the one to cancel it with: --id if given, else the ingress
sequence. A message delayd would dead-letter is refused with exit code 2, before anything is published:
a bad target (wildcards, '$' subjects, subjects under the prefix or under delayd.), and, checked against the
running delayd's configuration (its info API, delayd.api.info), a target its policy refuses, a delay beyond
its DELAYD_MAX_DELAY, a message too large, or another DELAYD_PREFIX. When no delayd answers, only the checks
that need no configuration are made (the ingress stream keeps the message for when delayd starts).

--id is the message's Nats-Msg-Id. The ingress stream drops a message whose id it stored within its duplicate
window (2 minutes), even one since cancelled or delivered: then nothing is stored, pub prints no id and exits
with code 7. Give each new message a new id (to move a message: cancel it, publish with a new id).`,
		Example: `  delayctl pub orders.close 'close order 42' --level 2
  delayctl pub orders.close --in 47m --id order-42-close -H 'Tenant: acme' < payload.json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return withCode(exitUsage, "pub takes SUBJECT and an optional DATA, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			var opts []delayd.PublishOpt
			n := 0
			if flags.Changed("level") {
				n++
				if level < 0 {
					return withCode(exitUsage, "--level %d: must be >= 0", level)
				}
				opts = append(opts, delayd.WithLevel(level))
			}
			if flags.Changed("in") {
				n++
				if in < 0 {
					return withCode(exitUsage, "--in %s: must be >= 0", in)
				}
				opts = append(opts, delayd.WithDuration(in))
			}
			if flags.Changed("at") {
				n++
				t, err := time.Parse(time.RFC3339Nano, at)
				if err != nil {
					return withCode(exitUsage, "--at %q: want an RFC 3339 time such as 2026-11-30T08:00:00Z", at)
				}
				opts = append(opts, delayd.WithDeliverAt(t))
			}
			if n != 1 {
				return withCode(exitUsage, "pub needs exactly one of --level, --in and --at")
			}
			if flags.Changed("id") {
				if err := checkID(msgID); err != nil {
					return err
				}
				opts = append(opts, delayd.WithMsgID(msgID))
			}
			if flags.Changed("merge-key") {
				opts = append(opts, delayd.WithMergeKey(mergeKey))
			}
			h := nats.Header{}
			for _, kv := range headers {
				k, v, ok := strings.Cut(kv, ":")
				k, v = strings.TrimSpace(k), strings.TrimSpace(v)
				if !ok || k == "" || strings.ContainsFunc(k, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
					return withCode(exitUsage, "-H %q: want 'Key: Value'", kv)
				}
				h.Add(k, v)
			}
			if len(h) > 0 {
				opts = append(opts, delayd.WithHeader(h))
			}
			opts = append(opts, delayd.WithPrefix(a.cfg.Prefix))

			var data []byte
			if len(args) == 2 && args[1] != "-" {
				data = []byte(args[1])
			} else {
				if isTerminal(a.stdin) {
					fmt.Fprintln(a.stderr, "delayctl: reading the message from standard input; end it with Ctrl-D")
				}
				b, err := io.ReadAll(a.stdin)
				if err != nil {
					return fmt.Errorf("read standard input: %w", err)
				}
				data = b
			}
			subject := args[0]
			if err := contract.ValidateTarget(subject, a.cfg.Prefix); err != nil {
				return withCode(exitUsage, "target %q: %v", subject, err)
			}

			// No stream info: pub needs only what delayd.Publish needs (the ingress subject, _INBOX.> for the
			// PubAck, delayd.api.info), so a publisher's NATS user without JetStream API permissions can use it.
			if err := a.connect(); err != nil {
				return err
			}
			ctx, cancel := a.reqCtx(cmd.Context())
			defer cancel()
			id, err := delayd.Publish(ctx, a.js, subject, data, opts...)
			switch {
			case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
				return withCode(exitNoStreams, "no delayd streams on this server (%s missing): no stream captures %s.%s; is delayd running with DELAYD_PREFIX=%s and this account? (%v)", deliver.IngressStream, a.cfg.Prefix, subject, a.cfg.Prefix, err)
			case errors.Is(err, delayd.ErrDuplicate):
				// Nothing stored: a success on stdout would hide it (docs/guide.md#re-using-an-id).
				return withCode(exitDuplicate, "%v", err)
			case errors.Is(err, delayd.ErrInvalidLevel), errors.Is(err, delayd.ErrInvalidDelay), errors.Is(err, contract.ErrInvalidTarget), errors.Is(err, contract.ErrForbiddenTarget),
				errors.Is(err, contract.ErrDeniedTarget), errors.Is(err, delayd.ErrTooLarge), errors.Is(err, delayd.ErrPrefixMismatch):
				// Refused before publishing: the running delayd would dead-letter it.
				return withCode(exitUsage, "%v", err)
			case err != nil:
				return err
			}
			fmt.Fprintln(a.stdout, id)
			fmt.Fprintf(a.stderr, "delayctl: published to %s.%s; cancel with: delayctl cancel %s %s\n", a.cfg.Prefix, subject, subject, shellQuote(id))
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&level, "level", 0, "delay level: index into delayd's level table (0: at once)")
	f.DurationVar(&in, "in", 0, "deliver after this Go duration (90s, 47m, 1h30m)")
	f.StringVar(&at, "at", "", "deliver at this RFC 3339 time")
	f.StringVar(&msgID, "id", "", "the message's Nats-Msg-Id (dedupes at ingress for 2m: a re-used id stores nothing, exit 7; the id to cancel with)")
	f.StringVar(&mergeKey, "merge-key", "", "Delay-Merge-Key: merge into a pending message with the same key and target")
	f.StringArrayVarP(&headers, "header", "H", nil, "a user header, 'Key: Value' (repeatable)")
	return cmd
}

func (a *app) cancelCmd() *cobra.Command {
	var anyTarget, all bool
	cmd := &cobra.Command{
		Use:   "cancel TARGET ID | cancel --any ID | cancel --all TARGET",
		Short: "Cancel a pending delayed message by its target and id",
		Long: `cancel asks delayd (request to delayd.api.cancel.TARGET) to cancel the delayed message bound for the
target subject TARGET (as given to pub, e.g. orders.close) with id ID: the id pub printed, the publisher's
Nats-Msg-Id, or the ingress sequence. A message with that id but another target answers "not found". It prints
delayd's answer:

  cancelled          exit 0: the message will never be delivered
  not found          exit 5: no pending message bound for TARGET has that id
  already delivered  exit 6: it was handed to its target before the cancel

--any ID uses the unscoped operator form (request to delayd.api.cancel): a message of any target.

--all TARGET cancels every message pending for TARGET that was published before the request (one request to
delayd.api.cancelall.TARGET), each decided as a single cancel is, and prints how many:

  cancelled N (already delivered M)               exit 0
  cancelled N (already delivered M), incomplete   exit 0: delayd's budget (20 s) ran out; run it again for the rest

If no delayd answers, it exits 1.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case all && anyTarget:
				return withCode(exitUsage, "cancel takes --all or --any, not both")
			case all && len(args) != 1:
				return withCode(exitUsage, "cancel --all takes one TARGET, got %d arguments", len(args))
			case all:
				if err := contract.ValidateTarget(args[0], "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
					return withCode(exitUsage, "bad target: %v", err)
				}
				return nil
			case anyTarget && len(args) != 1:
				return withCode(exitUsage, "cancel --any takes one ID, got %d arguments", len(args))
			case !anyTarget && len(args) != 2:
				return withCode(exitUsage, "cancel takes TARGET and ID (or --any ID), got %d arguments", len(args))
			case !anyTarget:
				if err := contract.ValidateTarget(args[0], "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
					return withCode(exitUsage, "bad target: %v", err)
				}
			}
			return checkID(args[len(args)-1])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.connect(); err != nil {
				return err
			}
			if all {
				return a.cancelAll(cmd.Context(), args[0])
			}
			// delayd may wait up to 25 s for its router to catch up, and
			// answers "error: ..." then: give it that long at least.
			ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, cancelTimeout))
			defer cancel()
			var (
				res     delayd.CancelResult
				err     error
				subject = delayd.CancelSubject
			)
			if anyTarget {
				res, err = delayd.CancelAny(ctx, a.nc, args[0])
			} else {
				subject = delayd.CancelSubjectFor(args[0])
				res, err = delayd.Cancel(ctx, a.nc, args[0], args[1])
			}
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				return fmt.Errorf("no delayd answered on %s: is delayd running (a version with scoped cancel)?", subject)
			case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, max(a.timeout, cancelTimeout))
			case err != nil:
				return err
			}
			fmt.Fprintln(a.stdout, res)
			switch res {
			case delayd.NotFound:
				return &codeError{code: exitNotFound, err: errSilent}
			case delayd.AlreadyDelivered:
				return &codeError{code: exitAlreadyDelivered, err: errSilent}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&anyTarget, "any", false, "the unscoped operator form: cancel a message of any target by ID alone")
	cmd.Flags().BoolVar(&all, "all", false, "cancel every message pending for TARGET (published before the request)")
	return cmd
}

// cancelAll runs `cancel --all TARGET`: one cancel-all request, its counts printed.
func (a *app) cancelAll(ctx context.Context, target string) error {
	// delayd may wait up to 25 s for its router, then work up to 20 s.
	wait := max(a.timeout, cancelAllTimeout)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	subject := delayd.CancelAllSubjectFor(target)
	res, err := delayd.CancelAll(ctx, a.nc, target)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("no delayd answered on %s: is delayd running (a version with cancel-all)?", subject)
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, wait)
	case err != nil:
		return err
	}
	line := fmt.Sprintf("cancelled %d (already delivered %d)", res.Cancelled, res.AlreadyDelivered)
	if !res.Complete {
		line += ", incomplete"
	}
	fmt.Fprintln(a.stdout, line)
	return nil
}

// cancelAllTimeout is how long `cancel --all` waits for its answer at least.
const cancelAllTimeout = time.Minute

// errSilent is an error whose message was already printed (an answer with its own exit code).
var errSilent = errors.New("")

// checkID rejects a message id that cannot be one: empty, or with white space or control characters at its ends
// or control characters anywhere.
func checkID(id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return withCode(exitUsage, "bad id %q: empty", id)
	case strings.TrimSpace(id) != id:
		return withCode(exitUsage, "bad id %q: leading or trailing white space", id)
	case strings.ContainsFunc(id, unicode.IsControl):
		return withCode(exitUsage, "bad id %q: control characters", id)
	}
	return nil
}

// shellQuote quotes s for a shell if it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == ':' || r == '/' || unicode.IsLetter(r) || unicode.IsDigit(r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// cancelTimeout is the least time delayctl cancel waits for delayd's answer.
const cancelTimeout = 30 * time.Second
