package deliver

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// pubAck is a PubAck outcome that resolves after a delay: the settle state
// machine is driven with outcomes a real server produces only under faults
// (a PubAck failing late, after a partial confirmation looked). The offsets
// bucket and the connection are a real embedded nats-server.
type pubAck struct {
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *pubAck) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *pubAck) Err() <-chan error            { return f.err }
func (f *pubAck) Msg() *nats.Msg               { return nil }

func outcome(fail bool, after time.Duration) *pubAck {
	f := &pubAck{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	resolve := func() {
		if fail {
			f.err <- errors.New("puback timeout")
		} else {
			f.ok <- &jetstream.PubAck{}
		}
	}
	if after == 0 {
		resolve()
	} else {
		time.AfterFunc(after, resolve)
	}
	return f
}

func settleScanner(t *testing.T) *Scanner {
	t.Helper()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	store, err := offsets.New(context.Background(), js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewScanner(nc, js, ScannerConfig{Stream: "DELAYD_5S", Offsets: store, Targets: NewTargetIndex(nc, js, nil), Window: 4})
	if err != nil {
		t.Fatal(err)
	}
	s.offset, s.committed, s.next = 9, 9, 15
	return s
}

// TestSettleFirstLateFailure: a PubAck among the oldest half fails only
// while it is awaited. Everything in flight must be settled with it, the
// scanner rewound to it, and later successes remembered, so that no
// sequence is skipped and the offset never passes an undelivered message.
func TestSettleFirstLateFailure(t *testing.T) {
	t.Parallel()
	s := settleScanner(t)
	s.inflight = []delivery{
		{seq: 10, target: "t", fut: outcome(false, 0)},
		{seq: 11, target: "t", fut: outcome(true, 30*time.Millisecond)},
		{seq: 12, target: "t", fut: outcome(false, 0)},
		{seq: 13, target: "t", fut: outcome(true, 0)},
		{seq: 14, target: "t", fut: outcome(false, 0)},
	}
	s.settleFirst(context.Background(), 2)
	if s.offset != 10 || s.committed != 10 {
		t.Errorf("offset %d committed %d, want 10 and 10: it must stop before the failed 11", s.offset, s.committed)
	}
	if s.next != 11 {
		t.Errorf("next = %d, want 11 (rewound to the first failure)", s.next)
	}
	if len(s.inflight) != 0 {
		t.Errorf("still in flight after a failure: %v", s.inflight)
	}
	var done []uint64
	for seq := range s.done {
		done = append(done, seq)
	}
	slices.Sort(done)
	if !slices.Equal(done, []uint64{12, 14}) {
		t.Errorf("remembered as confirmed %v, want [12 14] (13 failed and is sent again)", done)
	}
	if !s.probing {
		t.Error("not probing after a failure")
	}
}

// TestSettleFirstKeepsRestInFlight: with no failure, only the oldest n are
// confirmed and the rest stay in flight, in order.
func TestSettleFirstKeepsRestInFlight(t *testing.T) {
	t.Parallel()
	s := settleScanner(t)
	s.inflight = []delivery{
		{seq: 10, target: "t", fut: outcome(false, 0)},
		{seq: 11, target: "t", fut: outcome(false, 0)},
		{seq: 12, target: "t", fut: outcome(false, 20*time.Millisecond)},
		{seq: 13, target: "t", fut: outcome(false, 20*time.Millisecond)},
	}
	s.settleFirst(context.Background(), 2)
	if s.offset != 11 {
		t.Errorf("offset = %d, want 11", s.offset)
	}
	var left []uint64
	for _, d := range s.inflight {
		left = append(left, d.seq)
	}
	if !slices.Equal(left, []uint64{12, 13}) {
		t.Errorf("left in flight %v, want [12 13]", left)
	}
	s.settle(context.Background())
	if s.offset != 13 || len(s.inflight) != 0 {
		t.Errorf("after settle: offset %d, in flight %d; want 13 and 0", s.offset, len(s.inflight))
	}
}
