package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
)

func (a *app) statusCmd() *cobra.Command {
	var anyTarget bool
	cmd := &cobra.Command{
		Use:   "status TARGET ID | status --any ID",
		Short: "Tell the state of a delayed message by its target and id, without changing it",
		Long: `status asks delayd (request to delayd.api.status.TARGET) the state of the delayed message bound for the
target subject TARGET with id ID (as for cancel: the id pub printed, the publisher's Nats-Msg-Id, the ingress
sequence, or the Nats-Msg-Id the message was delivered with). It changes nothing. It prints delayd's answer:

  pending            exit 0: not delivered yet; "due" is when it will be (its delivery time, UTC)
  not found          exit 5: no message bound for TARGET has that id (or it left its level longer ago than
                             DELAYD_ANSWER_KEEP)
  already delivered  exit 6: it was handed to its target
  cancelled          exit 8: it was cancelled; it is never delivered

--any ID uses the unscoped operator form (request to delayd.api.status): a message of any target.
If no delayd answers, it exits 1.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case anyTarget && len(args) != 1:
				return withCode(exitUsage, "status --any takes one ID, got %d arguments", len(args))
			case !anyTarget && len(args) != 2:
				return withCode(exitUsage, "status takes TARGET and ID (or --any ID), got %d arguments", len(args))
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
			// As a cancel's: delayd may wait up to 25 s for its router.
			ctx, cancel := context.WithTimeout(cmd.Context(), max(a.timeout, cancelTimeout))
			defer cancel()
			var (
				res     delayd.StatusResult
				err     error
				subject = delayd.StatusSubject
			)
			if anyTarget {
				res, err = delayd.StatusAny(ctx, a.nc, args[0])
			} else {
				subject = delayd.StatusSubjectFor(args[0])
				res, err = delayd.Status(ctx, a.nc, args[0], args[1])
			}
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				return fmt.Errorf("no delayd answered on %s: is delayd running (a version with the status API)?", subject)
			case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("no answer on %s within %s: is delayd overloaded or stuck, or may this NATS user not publish there?", subject, max(a.timeout, cancelTimeout))
			case err != nil:
				return err
			}
			switch res.State {
			case delayd.Pending:
				fmt.Fprintf(a.stdout, "%s  due %s\n", res.State, contract.FormatTime(res.DueAt))
				return nil
			case delayd.StateNotFound:
				fmt.Fprintln(a.stdout, res.State)
				return &codeError{code: exitNotFound, err: errSilent}
			case delayd.StateDelivered:
				fmt.Fprintln(a.stdout, res.State)
				return &codeError{code: exitAlreadyDelivered, err: errSilent}
			}
			fmt.Fprintln(a.stdout, res.State)
			return &codeError{code: exitCancelled, err: errSilent}
		},
	}
	cmd.Flags().BoolVar(&anyTarget, "any", false, "the unscoped operator form: a message of any target by ID alone")
	return cmd
}
