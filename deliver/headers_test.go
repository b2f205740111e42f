package deliver

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// parseTimeCases are RFC 3339 times in delayd's form, near it, and not
// times at all: parseTime must agree with time.Parse on each.
var parseTimeCases = []string{
	"2026-11-29T22:12:09.799452339Z",
	"2026-11-29T22:12:09.000000000Z",
	"0000-01-01T00:00:00.000000000Z",
	"9999-12-31T23:59:59.999999999Z",
	"2024-02-29T12:00:00.000000001Z", // leap day
	"2100-02-29T12:00:00.000000000Z", // no leap day in 2100
	"2000-02-29T12:00:00.000000000Z", // but in 2000
	"2026-02-29T12:00:00.000000000Z",
	"2026-04-31T12:00:00.000000000Z",
	"2026-13-01T12:00:00.000000000Z",
	"2026-00-01T12:00:00.000000000Z",
	"2026-01-00T12:00:00.000000000Z",
	"2026-01-01T24:00:00.000000000Z",
	"2026-01-01T23:60:00.000000000Z",
	"2026-01-01T23:59:60.000000000Z", // leap second
	"2026-01-01t23:59:59.000000000Z",
	"2026-01-01T23:59:59.000000000z",
	"2026-01-01T23:59:59,000000000Z",
	"2026-01-01T23:59:59.00000000aZ",
	"2026-01-01T23:59:59.0000000-0Z",
	"+026-01-01T23:59:59.000000000Z",
	"2026-01-01T23:59:59Z",
	"2026-01-01T23:59:59.5Z",
	"2026-01-01T23:59:59.000000000+02:00",
	"2026-01-01T23:59:59.0000000000Z",
	"0000-01-01T00:00:00.000000000Z0", // found by FuzzParseTime
	"",
	"not a time",
}

// TestParseTime: parseTime gives what time.Parse with time.RFC3339Nano gives
// (the same instant and location, or an error for the same inputs), and
// reads delayd's own form (contract.FormatTime) back exactly.
func TestParseTime(t *testing.T) {
	t.Parallel()
	for _, v := range parseTimeCases {
		checkParseTime(t, v)
	}
	for _, at := range []time.Time{time.Now(), time.Unix(0, 0), time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", 3600))} {
		got, err := parseTime(contract.FormatTime(at))
		if err != nil || !got.Equal(at) || got.Location() != time.UTC {
			t.Errorf("parseTime(FormatTime(%v)) = %v, %v; want the same instant in UTC", at, got, err)
		}
	}
}

// FuzzParseTime compares parseTime with time.Parse on any input.
func FuzzParseTime(f *testing.F) {
	for _, v := range parseTimeCases {
		f.Add(v)
	}
	f.Fuzz(checkParseTime)
}

func checkParseTime(t *testing.T, v string) {
	want, wantErr := time.Parse(time.RFC3339Nano, v)
	got, err := parseTime(v)
	// time.Parse makes a new Location for each numeric offset: compared by
	// instant, zone name and offset, and as a whole (UTC included) where
	// its Location is time.UTC.
	gotZone, gotOff := got.Zone()
	wantZone, wantOff := want.Zone()
	if (err != nil) != (wantErr != nil) || !got.Equal(want) || gotZone != wantZone || gotOff != wantOff ||
		(want.Location() == time.UTC && got != want) {
		t.Errorf("parseTime(%q) = %v, %v; time.Parse gives %v, %v", v, got, err, want, wantErr)
	}
}

// TestDeliveryHeaders: the headers a target receives from a level message
// (README "What the target receives"): the user's headers as they were,
// every Nats-* and Delayd-* header removed, Nats-Msg-Id the publisher's id
// or the delivery id derived from the first ingress reference, Delay-Hops
// the hops made.
func TestDeliveryHeaders(t *testing.T) {
	t.Parallel()
	key := hopKey("0123456789abcdef0123456789abcdef")
	derived := func(ref string) string { return key.deliveryID(ref) }
	for _, tc := range []struct {
		name string
		in   nats.Header
		want nats.Header
	}{{
		name: "publisher id",
		in: nats.Header{"Trace-Id": {"a", "b"}, hdrMsgID: {"order-42"}, hdrIngress: {"delayd-1-7"},
			contract.HeaderDueAt: {"2026-11-29T22:12:09.799452339Z"}, "Nats-Expected-Last-Sequence": {"6"}},
		want: nats.Header{"Trace-Id": {"a", "b"}, contract.HeaderNatsMsgID: {"order-42"},
			contract.HeaderDueAt: {"2026-11-29T22:12:09.799452339Z"}},
	}, {
		name: "derived from ingress",
		in:   nats.Header{hdrIngress: {"delayd-1-7"}, "delayd-merge": {"k"}},
		want: nats.Header{contract.HeaderNatsMsgID: {derived("delayd-1-7")}},
	}, {
		name: "derived from origin, hops",
		in:   nats.Header{hdrIngress: {"delayd-1-9"}, hdrOrigin: {"delayd-1-7"}, hdrHops: {"2"}, hdrMsgID: {""}},
		want: nats.Header{contract.HeaderNatsMsgID: {derived("delayd-1-7")}, contract.HeaderHops: {"2"}},
	}, {
		name: "repeated internal values: the first",
		in:   nats.Header{hdrMsgID: {"x", "y"}, hdrHops: {"3", "4"}},
		want: nats.Header{contract.HeaderNatsMsgID: {"x"}, contract.HeaderHops: {"3"}},
	}, {
		name: "no reference",
		in:   nats.Header{"A": {"1"}, hdrHops: {""}},
		want: nats.Header{"A": {"1"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Scanner{}
			s.cfg.hopKey = key
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
		s := &Scanner{subject: "delayd.level.10S.", delay: 10 * time.Second}
		s.cfg.hopKey = hopKey("0123456789abcdef0123456789abcdef")
		s.idMAC = s.cfg.hopKey.newIDMAC()
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
