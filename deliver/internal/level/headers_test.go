package level

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/hop"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/message"
)

// TestDeliveryHeaders: the headers a target receives from a level message
// (docs/guide.md#what-the-target-receives): the user's headers as they were,
// every Nats-* and Delayd-* header removed, Nats-Msg-Id the publisher's id
// or the delivery id derived from the first ingress reference, Delay-Hops
// the hops made, Delay-Rescheduled the moves made (Delayd-Moves).
func TestDeliveryHeaders(t *testing.T) {
	t.Parallel()
	key := hop.Key("0123456789abcdef0123456789abcdef")
	derived := func(ref string) string { return key.DeliveryID(ref) }
	for _, tc := range []struct {
		name string
		in   nats.Header
		want nats.Header
	}{{
		name: "publisher id",
		in: nats.Header{"Trace-Id": {"a", "b"}, message.HdrMsgID: {"order-42"}, message.HdrIngress: {"delayd-1-7"},
			contract.HeaderDueAt: {"2026-11-29T22:12:09.799452339Z"}, "Nats-Expected-Last-Sequence": {"6"}},
		want: nats.Header{"Trace-Id": {"a", "b"}, contract.HeaderNatsMsgID: {"order-42"},
			contract.HeaderDueAt: {"2026-11-29T22:12:09.799452339Z"}},
	}, {
		name: "derived from ingress",
		in:   nats.Header{message.HdrIngress: {"delayd-1-7"}, "delayd-merge": {"k"}},
		want: nats.Header{contract.HeaderNatsMsgID: {derived("delayd-1-7")}},
	}, {
		name: "derived from origin, hops",
		in:   nats.Header{message.HdrIngress: {"delayd-1-9"}, message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"2"}, message.HdrMsgID: {""}},
		want: nats.Header{contract.HeaderNatsMsgID: {derived("delayd-1-7")}, contract.HeaderHops: {"2"}},
	}, {
		name: "rescheduled",
		in:   nats.Header{message.HdrMsgID: {"x"}, message.HdrHops: {"1"}, message.HdrMoves: {"2"}},
		want: nats.Header{contract.HeaderNatsMsgID: {"x"}, contract.HeaderHops: {"1"}, contract.HeaderRescheduled: {"2"}},
	}, {
		name: "rescheduled, no hops",
		in:   nats.Header{message.HdrMsgID: {"x"}, message.HdrHops: {"0"}, message.HdrMoves: {"1"}},
		want: nats.Header{contract.HeaderNatsMsgID: {"x"}, contract.HeaderRescheduled: {"1"}},
	}, {
		name: "repeated internal values: the first",
		in:   nats.Header{message.HdrMsgID: {"x", "y"}, message.HdrHops: {"3", "4"}},
		want: nats.Header{contract.HeaderNatsMsgID: {"x"}, contract.HeaderHops: {"3"}},
	}, {
		name: "no reference",
		in:   nats.Header{"A": {"1"}, message.HdrHops: {""}},
		want: nats.Header{"A": {"1"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &owner{Level: &Level{}}
			s.cfg.HopKey = key
			s.deliveryHeaders(tc.in)
			if len(tc.in) != len(tc.want) {
				t.Fatalf("headers %v, want %v", tc.in, tc.want)
			}
			for k, vs := range tc.want {
				if got := tc.in[k]; len(got) != len(vs) || (len(vs) > 0 && got[0] != vs[0]) || (len(vs) > 1 && got[1] != vs[1]) {
					t.Errorf("%s: %q, want %q (all: %v)", k, got, vs, tc.in)
				}
			}
		})
	}
}

// TestDeliveryWireAllocs: past the client's decode, a core delivery with a
// publisher id allocates nothing in the scanner (ack metadata, due time,
// hop due time, the target's headers), and one with a derived id only that
// id's string.
func TestDeliveryWireAllocs(t *testing.T) {
	for _, tc := range []struct {
		withID bool
		want   float64
	}{{true, 0}, {false, 1}} {
		subject, reply, hdr, data := levelWire(tc.withID)
		s := &owner{Level: &Level{cfg: settings{subject: "delayd.level.10S.", delay: 10 * time.Second}}}
		s.cfg.HopKey = hop.Key("0123456789abcdef0123456789abcdef")
		s.io.idMAC = s.cfg.HopKey.NewIDMAC()
		ms := make([]*nats.Msg, 0, 110)
		for range cap(ms) {
			h, err := nats.DecodeHeadersMsg(hdr)
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, &nats.Msg{Subject: subject, Reply: reply, Header: h, Data: data})
		}
		i := 0
		got := testing.AllocsPerRun(100, func() {
			m := ms[i]
			i++
			meta, ok := jswire.ParseAck(m.Reply)
			target, due := s.parse(m, meta.Stored)
			_, hop := s.hopDue(m)
			if !ok || target != "orders.close" || due.IsZero() || hop {
				t.Fatal("bad parse")
			}
			s.deliveryHeaders(m.Header)
		})
		if got != tc.want {
			t.Errorf("with publisher id %v: %v allocations per delivery, want %v", tc.withID, got, tc.want)
		}
	}
}
