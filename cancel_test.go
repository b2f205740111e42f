package delayd

import (
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// TestCancelAnswer checks how a cancel reply maps to an answer or error: by
// its Delay-Status code when it has one, by its text when it has none (a
// delayd from before the codes), and that an error answer matches its
// sentinel and ErrCancelReply and keeps the text it always had.
func TestCancelAnswer(t *testing.T) {
	t.Parallel()
	sentinels := []error{ErrAmbiguousID, ErrRouterBehind, ErrCancelBusy, ErrCancelFailed}
	tests := []struct {
		name   string
		status string // "" for no Delay-Status header
		body   string
		want   CancelResult
		err    error // the sentinel the error must match besides ErrCancelReply; nil for an answer, ErrCancelReply for none
	}{
		{"cancelled", "200", "cancelled", Cancelled, nil},
		{"not found", "404", "not found", NotFound, nil},
		{"already delivered", "409", "already delivered", AlreadyDelivered, nil},
		{"ambiguous id", "400", "error: ambiguous id \"2\": it names two messages", "", ErrAmbiguousID},
		{"router behind", "503", "error: the router has not yet placed every message published before this cancel; try again", "", ErrRouterBehind},
		{"busy", "429", "error: busy: too many cancel requests waiting; try again", "", ErrCancelBusy},
		{"failed", "500", "error: stream info: timeout", "", ErrCancelFailed},
		{"unknown code", "418", "teapot", "", ErrCancelFailed},
		{"the code decides, not the text", "404", "cancelled", NotFound, nil},
		{"no code: cancelled", "", "cancelled", Cancelled, nil},
		{"no code: not found", "", "not found", NotFound, nil},
		{"no code: already delivered", "", "already delivered", AlreadyDelivered, nil},
		{"no code: error", "", "error: ambiguous id \"2\"", "", ErrCancelReply},
		{"bad code", "abc", "cancelled", "", ErrCancelReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &nats.Msg{Data: []byte(tt.body), Header: nats.Header{}}
			if tt.status != "" {
				m.Header.Set(contract.HeaderStatus, tt.status)
			}
			got, err := cancelAnswer(m)
			if got != tt.want {
				t.Errorf("answer %q, want %q", got, tt.want)
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
			if want := "delayd: unexpected cancel reply: " + strconv.Quote(tt.body); err.Error() != want {
				t.Errorf("error text %q, want %q", err.Error(), want)
			}
			var ce *CancelError
			if !errors.As(err, &ce) || ce.Reply != tt.body {
				t.Errorf("error %v: not a *CancelError with the reply's body", err)
			}
		})
	}
}

// TestCancelResultErr checks the answers' errors: nil only for Cancelled.
func TestCancelResultErr(t *testing.T) {
	t.Parallel()
	if err := Cancelled.Err(); err != nil {
		t.Errorf("Cancelled.Err() = %v, want nil", err)
	}
	if err := NotFound.Err(); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrAlreadyDelivered) {
		t.Errorf("NotFound.Err() = %v, want ErrNotFound", err)
	}
	if err := AlreadyDelivered.Err(); !errors.Is(err, ErrAlreadyDelivered) || errors.Is(err, ErrNotFound) {
		t.Errorf("AlreadyDelivered.Err() = %v, want ErrAlreadyDelivered", err)
	}
	if err := CancelResult("").Err(); !errors.Is(err, ErrCancelReply) {
		t.Errorf(`CancelResult("").Err() = %v, want ErrCancelReply`, err)
	}
}
