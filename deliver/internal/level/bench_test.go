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

// levelStreamMsg is a message as the scanner's level consumer delivers it.
func levelStreamMsg() *nats.Msg {
	return &nats.Msg{
		Subject: "delayd.level.10S.orders.close",
		Reply:   "$JS.ACK.DELAYD_10S.delayd-scan-DELAYD_10S.1.4242.4242.1795990280677514429.17",
		Header: nats.Header{
			"Content-Type":                []string{"application/json"},
			"Trace-Id":                    []string{"4bf92f3577b34da6a3ce929d0e0e4736"},
			contract.HeaderEnqueuedAt:     []string{"2026-11-29T22:11:59.799452339Z"},
			contract.HeaderDueAt:          []string{"2026-11-29T22:12:09.799452339Z"},
			message.HdrIngress:            []string{"delayd-1795990280677514429-4242"},
			message.HdrMsgID:              []string{"order-42-close"},
			"Nats-Expected-Last-Sequence": []string{"4241"},
		},
		Data: make([]byte, 128),
	}
}

// BenchmarkDeliveryMsg measures what the scanner does per message before
// the publish: sequence and due-time parsing, and turning the level message
// into the delivered message (internal headers stripped, Nats-Msg-Id set).
func BenchmarkDeliveryMsg(b *testing.B) {
	s := &owner{Level: &Level{cfg: settings{subject: "delayd.level.10S.", delay: 10 * time.Second}}}
	b.ReportAllocs()
	for b.Loop() {
		m := levelStreamMsg() // included: the client allocates this per message too
		if _, ok := jswire.ParseAck(m.Reply); !ok {
			b.Fatal("bad ack subject")
		}
		target, due := s.parse(m, time.Time{})
		if target != "orders.close" || due.IsZero() {
			b.Fatal("bad parse")
		}
		id := m.Header.Get(message.HdrMsgID)
		message.StripInternal(m.Header)
		m.Header[contract.HeaderNatsMsgID] = []string{id}
		m.Subject = target
	}
}

// levelWire is a level-stream message as the server sends it to the
// scanner's pull inbox: subject, reply, the header block and the payload
// (HMSG's three parts). With withID unset it has no publisher id, so its
// delivery id is derived from Delayd-Ingress.
func levelWire(withID bool) (subject, reply string, hdr, data []byte) {
	m := levelStreamMsg()
	hdr = []byte("NATS/1.0\r\n")
	for _, k := range []string{"Content-Type", "Trace-Id", contract.HeaderEnqueuedAt, contract.HeaderDueAt, message.HdrIngress, message.HdrMsgID, "Nats-Expected-Last-Sequence"} {
		if k == message.HdrMsgID && !withID {
			continue
		}
		hdr = append(hdr, k+": "+m.Header.Get(k)+"\r\n"...)
	}
	hdr = append(hdr, "\r\n"...)
	return m.Subject, m.Reply, hdr, m.Data
}

// BenchmarkDeliveryWire measures one core delivery's work in the client and
// the scanner, from the bytes read off the wire to the message handed to
// PublishMsg (without the server): what nats.go's read loop does per
// message (subject and reply strings, a payload copy, DecodeHeadersMsg, the
// Msg), then the scanner's: the ack-subject metadata, the target and due
// time, the hop due time, the headers the target receives, and the encoded
// header size PublishMsg computes. Sub-benchmarks: "client" is nats.go's
// part alone (the scanner's is the difference), "msgid" a message with a
// publisher id, "derived" one whose delivery id is derived from the ingress
// reference (keyed MAC).
func BenchmarkDeliveryWire(b *testing.B) {
	for _, name := range []string{"client", "msgid", "derived"} {
		withID := name != "derived"
		b.Run(name, func(b *testing.B) {
			s := &owner{Level: &Level{cfg: settings{subject: "delayd.level.10S.", delay: 10 * time.Second}}}
			s.cfg.HopKey = hop.Key("0123456789abcdef0123456789abcdef")
			subject, reply, hdr, data := levelWire(withID)
			wire := append(append([]byte{}, hdr...), data...)
			subj, rep := []byte(subject), []byte(reply)
			b.ReportAllocs()
			for b.Loop() {
				// nats.go's processMsg, as of v1.55.0.
				payload := make([]byte, len(wire))
				copy(payload, wire)
				h, err := nats.DecodeHeadersMsg(payload[:len(hdr)])
				if err != nil {
					b.Fatal(err)
				}
				m := &nats.Msg{Subject: string(subj), Reply: string(rep), Header: h, Data: payload[len(hdr):]}
				if name == "client" {
					continue
				}
				// The scanner's.
				meta, ok := jswire.ParseAck(m.Reply)
				if !ok {
					b.Fatal("bad ack subject")
				}
				target, due := s.parse(m, meta.Stored)
				if target != "orders.close" || due.IsZero() {
					b.Fatal("bad parse")
				}
				if _, hop := s.hopDue(m); hop {
					b.Fatal("not a hop")
				}
				s.deliveryHeaders(m.Header)
				m.Subject, m.Reply = target, ""
				if m.Header.Get(contract.HeaderNatsMsgID) == "" || m.Size() == 0 {
					b.Fatal("no id")
				}
			}
		})
	}
}
