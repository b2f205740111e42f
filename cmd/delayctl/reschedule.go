package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
)

func (a *app) rescheduleCmd() *cobra.Command {
	var (
		anyTarget, now bool
		level          int
		in             time.Duration
		at             string
	)
	cmd := &cobra.Command{
		Use:   "reschedule TARGET ID (--in DURATION | --at TIME | --level N | --now) | reschedule --any ID ...",
		Short: "Move a pending delayed message to a new time, keeping its id, payload and headers",
		Long: `reschedule asks delayd (request to delayd.api.reschedule.TARGET) to move the pending message bound for the
target subject TARGET with id ID (as for cancel) to a new delay, given as pub gives one:

  --in 90s      a Go duration after delayd receives the request (0s: at once)
  --at TIME     an RFC 3339 time, 2026-12-03T09:00:00Z (in the past: at once)
  --level N     a level of delayd's table, after delayd receives the request (0: at once)
  --now         at once ("run now")

The message keeps its id, payload and headers, and is delivered once: never before its new due, never at its old
one (its delivery carries Delay-Rescheduled). It prints delayd's answer:

  rescheduled  due TIME  exit 0: TIME (UTC) is its new due
  not found              exit 5: no pending message bound for TARGET has that id
  already delivered      exit 6: it was handed to its target before the reschedule

A delay beyond delayd's longest (DELAYD_MAX_DELAY) exits 2. --any ID uses the unscoped operator form (request to
delayd.api.reschedule): a message of any target. If no delayd answers, it exits 1.`,
		Example: `  delayctl reschedule orders.remind remind-42 --in 2h
  delayctl reschedule orders.remind remind-42 --now`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := targetAndID("reschedule", anyTarget, args); err != nil {
				return err
			}
			n := 0
			for _, name := range []string{"in", "at", "level", "now"} {
				if cmd.Flags().Changed(name) {
					n++
				}
			}
			if n != 1 {
				return withCode(exitUsage, "reschedule needs exactly one of --in, --at, --level and --now")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := cmd.Flags()
			var when delayd.When
			switch {
			case flags.Changed("in"):
				if in < 0 {
					return withCode(exitUsage, "--in %s: must be >= 0", in)
				}
				when = delayd.In(in)
			case flags.Changed("at"):
				t, err := time.Parse(time.RFC3339Nano, at)
				if err != nil {
					return withCode(exitUsage, "--at %q: want an RFC 3339 time such as 2026-12-03T09:00:00Z", at)
				}
				when = delayd.At(t)
			case flags.Changed("level"):
				if level < 0 {
					return withCode(exitUsage, "--level %d: must be >= 0", level)
				}
				when = delayd.AtLevel(level)
			case now:
				when = delayd.Now()
			default:
				return withCode(exitUsage, "--now=false: give --now, --in, --at or --level")
			}
			if err := a.connect(); err != nil {
				return err
			}
			// As a cancel's: delayd may wait up to 25 s for its router.
			ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, cancelTimeout))
			defer cancel()
			var (
				res     delayd.RescheduleResult
				err     error
				subject = delayd.RescheduleSubject
			)
			if anyTarget {
				res, err = delayd.RescheduleAny(ctx, a.nc, args[0], when)
			} else {
				subject = delayd.RescheduleSubjectFor(args[0])
				res, err = delayd.Reschedule(ctx, a.nc, args[0], args[1], when)
			}
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				return fmt.Errorf("no delayd answered on %s: is delayd running (a version with the reschedule API)?", subject)
			case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, max(a.timeout, cancelTimeout))
			case errors.Is(err, delayd.ErrInvalidDelay):
				return withCode(exitUsage, "%v", err)
			case err != nil:
				return err
			}
			switch res.Result {
			case delayd.Rescheduled:
				fmt.Fprintf(a.stdout, "%s  due %s\n", res.Result, contract.FormatTime(res.DueAt))
				return nil
			case delayd.RescheduleNotFound:
				fmt.Fprintln(a.stdout, res.Result)
				return &codeError{code: exitNotFound, err: errSilent}
			}
			fmt.Fprintln(a.stdout, res.Result)
			return &codeError{code: exitAlreadyDelivered, err: errSilent}
		},
	}
	f := cmd.Flags()
	f.DurationVar(&in, "in", 0, "deliver after this Go duration from now (90s, 47m, 1h30m)")
	f.StringVar(&at, "at", "", "deliver at this RFC 3339 time")
	f.IntVar(&level, "level", 0, "deliver after this level's delay from now (0: at once)")
	f.BoolVar(&now, "now", false, "deliver at once")
	f.BoolVar(&anyTarget, "any", false, "the unscoped operator form: a message of any target by ID alone")
	return cmd
}

// targetAndID checks the arguments of a command taking TARGET and ID, or
// --any ID.
func targetAndID(name string, anyTarget bool, args []string) error {
	switch {
	case anyTarget && len(args) != 1:
		return withCode(exitUsage, "%s --any takes one ID, got %d arguments", name, len(args))
	case !anyTarget && len(args) != 2:
		return withCode(exitUsage, "%s takes TARGET and ID (or --any ID), got %d arguments", name, len(args))
	case !anyTarget:
		if err := contract.ValidateTarget(args[0], "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
			return withCode(exitUsage, "bad target: %v", err)
		}
	}
	return checkID(args[len(args)-1])
}

func (a *app) showCmd() *cobra.Command {
	var anyTarget, asJSON bool
	cmd := &cobra.Command{
		Use:   "show TARGET ID | show --any ID",
		Short: "Show one pending delayed message: its due, place, headers and payload",
		Long: `show prints the pending message bound for the target subject TARGET with id ID (as for cancel): its due
(UTC), enqueue time, level, stream and sequence, hops, size, merge key, headers, and its payload (as text if it is
UTF-8, else "base64:" and the bytes in base64). It asks delayd the message's state (delayd.api.status.TARGET), then
lists the messages of TARGET due at that instant with their payloads (delayd.api.pending.TARGET). --json prints
the list API's item (payload in base64). It changes nothing.

  exit 0: pending; exit 5: not found; exit 6: already delivered; exit 8: cancelled

--any ID uses the operator forms (delayd.api.status, delayd.api.pending): a message of any target. If no delayd
answers, it exits 1.`,
		Args: func(cmd *cobra.Command, args []string) error { return targetAndID("show", anyTarget, args) },
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.connect(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, cancelTimeout))
			defer cancel()
			m, state, err := a.findPending(ctx, anyTarget, args)
			if err != nil {
				return err
			}
			switch state {
			case delayd.Pending:
			case delayd.StateNotFound:
				fmt.Fprintln(a.stdout, state)
				return &codeError{code: exitNotFound, err: errSilent}
			case delayd.StateDelivered:
				fmt.Fprintln(a.stdout, state)
				return &codeError{code: exitAlreadyDelivered, err: errSilent}
			default:
				fmt.Fprintln(a.stdout, state)
				return &codeError{code: exitCancelled, err: errSilent}
			}
			if asJSON {
				b, err := json.Marshal(m)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, string(b))
				return nil
			}
			printPending(a, m)
			return nil
		},
	}
	cmd.Flags().BoolVar(&anyTarget, "any", false, "the operator form: a message of any target by ID alone")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the message as the list API's JSON item")
	return cmd
}

// findPending finds the message args name (TARGET ID, or ID with --any):
// its state by the status API and, when pending, its list item among
// those due at its due. A message pending at the status answer but not
// in the list is asked once again: it may have been delivered, cancelled
// or moved meanwhile.
func (a *app) findPending(ctx context.Context, anyTarget bool, args []string) (delayd.PendingMsg, delayd.State, error) {
	id := args[len(args)-1]
	var due time.Time
	for range 2 {
		var (
			st      delayd.StatusResult
			err     error
			subject = delayd.StatusSubject
		)
		if anyTarget {
			st, err = delayd.StatusAny(ctx, a.nc, id)
		} else {
			subject = delayd.StatusSubjectFor(args[0])
			st, err = delayd.Status(ctx, a.nc, args[0], id)
		}
		if err := requestErr(err, subject, max(a.timeout, cancelTimeout)); err != nil {
			return delayd.PendingMsg{}, "", err
		}
		if st.State != delayd.Pending {
			return delayd.PendingMsg{}, st.State, nil
		}
		// Only the messages due at that instant: the list's bounds are
		// exclusive.
		opts := []delayd.PendingOpt{delayd.WithDueAfter(st.DueAt.Add(-time.Nanosecond)), delayd.WithDueBefore(st.DueAt.Add(time.Nanosecond)), delayd.WithPayload(), delayd.WithLimit(delayd.PendingLimitMax)}
		var items []delayd.PendingMsg
		for cursor := ""; ; {
			var page *delayd.PendingPage
			subject = delayd.PendingSubject
			if anyTarget {
				page, err = delayd.ListPendingAny(ctx, a.nc, "", append(opts, delayd.WithCursor(cursor))...)
			} else {
				subject = delayd.PendingSubjectFor(args[0])
				page, err = delayd.ListPending(ctx, a.nc, args[0], append(opts, delayd.WithCursor(cursor))...)
			}
			if err := requestErr(err, subject, max(a.timeout, cancelTimeout)); err != nil {
				return delayd.PendingMsg{}, "", err
			}
			items = append(items, page.Items...)
			if cursor = page.Next; cursor == "" {
				break
			}
		}
		// The list gives the id cancel takes: the publisher's id (or
		// "id:" and it), or "seq:N" for a message without one; ID may be
		// any of these forms, or N.
		if i := slices.IndexFunc(items, func(m delayd.PendingMsg) bool {
			return m.ID == id || m.ID == "id:"+id || m.ID == "seq:"+id || "id:"+m.ID == id
		}); i >= 0 {
			return items[i], delayd.Pending, nil
		}
		due = st.DueAt
	}
	return delayd.PendingMsg{}, "", fmt.Errorf("message %q is pending, due %s, but not listed under that id (a message with a publisher id is listed under it, not its ingress sequence)", id, contract.FormatTime(due))
}

// requestErr words a request's error as delayctl's other commands do.
func requestErr(err error, subject string, wait time.Duration) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("no delayd answered on %s: is delayd running (a version with the list API)?", subject)
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, wait)
	}
	return err
}

// printPending prints m as `show` does: one field a line.
func printPending(a *app, m delayd.PendingMsg) {
	w := a.stdout
	fmt.Fprintf(w, "id        %s\n", m.ID)
	fmt.Fprintf(w, "target    %s\n", m.Target)
	fmt.Fprintf(w, "due       %s\n", contract.FormatTime(m.Due))
	if !m.Enqueued.IsZero() {
		fmt.Fprintf(w, "enqueued  %s\n", contract.FormatTime(m.Enqueued))
	}
	fmt.Fprintf(w, "level     %s (%s sequence %d)\n", m.Level, m.Stream, m.Seq)
	if m.Hops > 0 {
		fmt.Fprintf(w, "hops      %d\n", m.Hops)
	}
	if m.MergeKey != "" {
		fmt.Fprintf(w, "merge key %s\n", m.MergeKey)
	}
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range m.Header[k] {
			fmt.Fprintf(w, "header    %s: %s\n", k, v)
		}
	}
	fmt.Fprintf(w, "size      %d\n", m.Size)
	if utf8.Valid(m.Data) {
		fmt.Fprintf(w, "payload   %s\n", m.Data)
	} else {
		fmt.Fprintf(w, "payload   base64:%s\n", base64.StdEncoding.EncodeToString(m.Data))
	}
}
