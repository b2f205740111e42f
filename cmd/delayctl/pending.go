package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
)

func (a *app) lsCmd() *cobra.Command {
	var (
		limit         int
		after, before string
		asJSON        bool
		anyTarget     bool
	)
	cmd := &cobra.Command{
		Use:   "ls TARGET | ls --any [SUBJECT]",
		Short: "List the messages pending for a target, in due order",
		Long: `ls asks delayd (requests to delayd.api.pending.TARGET) for the messages pending for the target subject
TARGET, in due order, and prints one line per message:

  DUE  ID  LEVEL  SIZE

DUE is when it will be delivered (UTC), ID the id cancel and status take. It follows the pages to the end
(--limit is the page size, default 100, at most 1000). --after and --before (RFC 3339) list only messages due
after or before a time. --json prints each message as a JSON line, the list API's item (id, due, headers, …). Then
it prints delayd's count of the messages pending for TARGET and the next due (whatever --after and --before say):

  N pending, next due DUE

--any [SUBJECT] uses the operator form (requests to delayd.api.pending): the messages pending for every target
SUBJECT matches (wildcards; default >), with each line's TARGET after its ID. Exit 0; 1 if no delayd answers.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case anyTarget && len(args) > 1:
				return withCode(exitUsage, "ls --any takes at most one SUBJECT, got %d arguments", len(args))
			case !anyTarget && len(args) != 1:
				return withCode(exitUsage, "ls takes TARGET (or --any [SUBJECT]), got %d arguments", len(args))
			case !anyTarget:
				if err := contract.ValidateTarget(args[0], "" /* the ingress prefix is the service's: only delayd's own subjects are refused here */); err != nil {
					return withCode(exitUsage, "bad target: %v", err)
				}
			}
			if limit < 1 || limit > delayd.PendingLimitMax {
				return withCode(exitUsage, "--limit %d is not in 1..%d", limit, delayd.PendingLimitMax)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := []delayd.PendingOpt{delayd.WithLimit(limit)}
			for _, f := range []struct {
				name, value string
				opt         func(time.Time) delayd.PendingOpt
			}{{"--after", after, delayd.WithDueAfter}, {"--before", before, delayd.WithDueBefore}} {
				if f.value == "" {
					continue
				}
				t, err := time.Parse(time.RFC3339Nano, f.value)
				if err != nil {
					return withCode(exitUsage, "%s: %v", f.name, err)
				}
				opts = append(opts, f.opt(t))
			}
			// The ingress prefix is known here, not in Args: a target under
			// it is refused as delayd refuses it.
			if !anyTarget {
				if err := contract.ValidateTarget(args[0], a.cfg.Prefix); err != nil {
					return withCode(exitUsage, "bad target: %v", err)
				}
			}
			if err := a.connect(); err != nil {
				return err
			}
			subject, filter := delayd.PendingSubject, ""
			if anyTarget && len(args) == 1 {
				filter = args[0]
			} else if !anyTarget {
				subject = delayd.PendingSubjectFor(args[0])
			}
			var first *delayd.PendingPage
			for cursor := ""; ; {
				ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, cancelTimeout))
				var (
					page *delayd.PendingPage
					err  error
				)
				if anyTarget {
					page, err = delayd.ListPendingAny(ctx, a.nc, filter, append(opts, delayd.WithCursor(cursor))...)
				} else {
					page, err = delayd.ListPending(ctx, a.nc, args[0], append(opts, delayd.WithCursor(cursor))...)
				}
				cancel()
				switch {
				case errors.Is(err, nats.ErrNoResponders):
					return fmt.Errorf("no delayd answered on %s: is delayd running (a version with the list API)?", subject)
				case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
					return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, max(a.timeout, cancelTimeout))
				case err != nil:
					return err
				}
				if first == nil {
					first = page
				}
				for _, m := range page.Items {
					if asJSON {
						b, err := json.Marshal(m)
						if err != nil {
							return err
						}
						fmt.Fprintln(a.stdout, string(b))
						continue
					}
					if anyTarget {
						fmt.Fprintf(a.stdout, "%s  %s  %s  %s  %d\n", contract.FormatTime(m.Due), m.ID, m.Target, m.Level, m.Size)
						continue
					}
					fmt.Fprintf(a.stdout, "%s  %s  %s  %d\n", contract.FormatTime(m.Due), m.ID, m.Level, m.Size)
				}
				if cursor = page.Next; cursor == "" {
					break
				}
			}
			switch {
			case asJSON:
			case first.Total == 0:
				fmt.Fprintln(a.stdout, "0 pending")
			default:
				fmt.Fprintf(a.stdout, "%d pending, next due %s\n", first.Total, contract.FormatTime(first.NextDue))
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", delayd.PendingLimitDefault, "messages per page (1..1000)")
	cmd.Flags().StringVar(&after, "after", "", "list only messages due after this RFC 3339 time")
	cmd.Flags().StringVar(&before, "before", "", "list only messages due before this RFC 3339 time")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each message as a JSON line")
	cmd.Flags().BoolVar(&anyTarget, "any", false, "the operator form: list across the targets SUBJECT matches (default >)")
	return cmd
}
