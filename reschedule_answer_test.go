package delayd

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// TestRescheduleAnswer checks how a reschedule reply maps to an answer or
// error: by its Delay-Status code, 200 with the new due from Delay-Due-At;
// an error answer matches ErrCancelReply and its sentinel, a 400 for the
// delay ErrInvalidDelay and an ambiguous id's ErrAmbiguousID (never both).
func TestRescheduleAnswer(t *testing.T) {
	t.Parallel()
	due := time.Date(2026, 12, 3, 18, 0, 0, 5, time.UTC)
	sentinels := []error{ErrInvalidDelay, ErrAmbiguousID, ErrRouterBehind, ErrCancelBusy, ErrCancelFailed}
	tests := []struct {
		name   string
		status string // "" for no Delay-Status header
		dueAt  string // Delay-Due-At, "" for none
		body   string
		want   RescheduleResult
		err    error // the sentinel the error must match besides ErrCancelReply; nil for an answer
	}{
		{"rescheduled", "200", contract.FormatTime(due), "rescheduled", RescheduleResult{Rescheduled, due}, nil},
		{"not found", "404", "", "not found", RescheduleResult{Result: RescheduleNotFound}, nil},
		{"already delivered", "409", "", "already delivered", RescheduleResult{Result: RescheduleDelivered}, nil},
		{"beyond the max delay", "400", "", `error: invalid delay: Delay-Duration "200h0m0s" is beyond the longest delay 168h (DELAYD_MAX_DELAY)`, RescheduleResult{}, ErrInvalidDelay},
		{"bad level", "400", "", `error: Delay-Level: invalid delay level: "x"`, RescheduleResult{}, ErrInvalidDelay},
		{"ambiguous id", "400", "", `error: ambiguous id "2": it names two messages`, RescheduleResult{}, ErrAmbiguousID},
		{"router behind", "503", "", "error: the router has not yet placed every message published before this cancel; try again", RescheduleResult{}, ErrRouterBehind},
		{"busy", "429", "", "error: busy: too many cancel requests waiting; try again", RescheduleResult{}, ErrCancelBusy},
		{"not available", "500", "", "error: reschedule is not available in this delayd", RescheduleResult{}, ErrCancelFailed},
		{"unknown code", "418", "", "teapot", RescheduleResult{}, ErrCancelFailed},
		{"200 without its due", "200", "", "rescheduled", RescheduleResult{}, ErrCancelFailed},
		{"no code", "", "", "rescheduled", RescheduleResult{}, ErrCancelReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &nats.Msg{Data: []byte(tt.body), Header: nats.Header{}}
			if tt.status != "" {
				m.Header.Set(contract.HeaderStatus, tt.status)
			}
			if tt.dueAt != "" {
				m.Header.Set(contract.HeaderDueAt, tt.dueAt)
			}
			got, err := rescheduleAnswer(m)
			if got != tt.want {
				t.Errorf("answer %+v, want %+v", got, tt.want)
			}
			if tt.err == nil {
				if err != nil {
					t.Errorf("error %v, want none", err)
				}
				return
			}
			if !errors.Is(err, ErrCancelReply) || !errors.Is(err, tt.err) {
				t.Fatalf("error %v, want one matching ErrCancelReply and %v", err, tt.err)
			}
			for _, s := range sentinels {
				if s != tt.err && errors.Is(err, s) {
					t.Errorf("error %v also matches %v", err, s)
				}
			}
		})
	}
	// A cancel's 400 stays an ambiguous id, never a bad delay.
	if _, err := cancelAnswer(&nats.Msg{Data: []byte("error: invalid delay"), Header: nats.Header{contract.HeaderStatus: {"400"}}}); !errors.Is(err, ErrAmbiguousID) || errors.Is(err, ErrInvalidDelay) {
		t.Errorf("a cancel's 400: %v, want ErrAmbiguousID only", err)
	}
}

// TestRescheduleResultErr checks the answers' errors: nil only for
// Rescheduled.
func TestRescheduleResultErr(t *testing.T) {
	t.Parallel()
	if err := (RescheduleResult{Result: Rescheduled}).Err(); err != nil {
		t.Errorf("Rescheduled: %v, want nil", err)
	}
	if err := (RescheduleResult{Result: RescheduleNotFound}).Err(); !errors.Is(err, ErrNotFound) {
		t.Errorf("RescheduleNotFound: %v, want ErrNotFound", err)
	}
	if err := (RescheduleResult{Result: RescheduleDelivered}).Err(); !errors.Is(err, ErrAlreadyDelivered) {
		t.Errorf("RescheduleDelivered: %v, want ErrAlreadyDelivered", err)
	}
	if err := (RescheduleResult{}).Err(); !errors.Is(err, ErrCancelReply) {
		t.Errorf("zero result: %v, want ErrCancelReply", err)
	}
}
