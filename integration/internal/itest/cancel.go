package itest

import (
	"context"
	"time"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
)

// Cancel cancels id with the unscoped operator form (delayd.CancelAny).
func (b *Bundle) Cancel(id string) delayd.CancelResult {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := delayd.CancelAny(ctx, b.NC, id)
	if err != nil {
		b.T.Fatalf("cancel %q: %v", id, err)
	}
	return r
}

// WantCancelReply sends a raw cancel request for id on the unscoped subject
// and checks the reply's body and Delay-Status code.
func (b *Bundle) WantCancelReply(id, body, status string) {
	b.T.Helper()
	m, err := b.NC.Request(delayd.CancelSubject, []byte(id), 15*time.Second)
	if err != nil {
		b.T.Fatalf("cancel %q: %v", id, err)
	}
	if string(m.Data) != body || m.Header.Get(contract.HeaderStatus) != status {
		b.T.Errorf("cancel %q: body %q %s %q, want %q %q", id, m.Data, contract.HeaderStatus, m.Header.Get(contract.HeaderStatus), body, status)
	}
}
