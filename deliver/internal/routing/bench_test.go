package routing

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/levels"
)

// ingressMsg is a typical ingress message: a level header, two user headers
// and a publisher id, as the router's pull loop receives it.
func ingressMsg() *nats.Msg {
	return &nats.Msg{
		Subject: "delay.orders.close",
		Reply:   "$JS.ACK.DELAYD_INGRESS.delayd-router.1.4242.4242.1795990280677514429.0",
		Header: nats.Header{
			"Delay-Level":  []string{"3"},
			"Content-Type": []string{"application/json"},
			"Trace-Id":     []string{"4bf92f3577b34da6a3ce929d0e0e4736"},
			"Nats-Msg-Id":  []string{"order-42-close"},
		},
		Data: make([]byte, 128),
	}
}

func benchRouter(b *testing.B) *Router {
	r, err := NewStandalone(nil, Config{Prefix: "delay", Levels: levels.Default()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r.run.ingressID = "1795990280677514429"
	return r
}

// BenchmarkClassify measures the router's header parsing and level choice
// for one ingress message: ack-subject metadata, the hop check, target
// validation, the case-insensitive Delay-Level lookup, levels.Table.Pick
// and the merge-key lookup.
func BenchmarkClassify(b *testing.B) {
	r := benchRouter(b)
	m := ingressMsg()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := jswire.ParseAck(m.Reply); !ok {
			b.Fatal("bad ack subject")
		}
		hop := checkHop(r.deps.HopKey, m.Subject, m.Header)
		if _, err := r.classifier.classify(m.Subject, m.Header, time.Time{}, hop); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLevelMsg measures building the level-stream message from an
// ingress message: a fresh header from the publisher's and delayd's, the
// two RFC 3339 timestamps, the derived id, the index records and the
// expected-last-sequence header.
func BenchmarkLevelMsg(b *testing.B) {
	r := benchRouter(b)
	stored := time.Now()
	w := r.writers.all[3]
	p := placement{Level: w.level, Target: "orders.close"}
	b.ReportAllocs()
	for b.Loop() {
		m := ingressMsg() // included: the client allocates this per message too
		rt := &routing{msg: m, seq: 4242, w: w}
		var due time.Time
		rt.out, due = levelMessage(m.Header, m.Data, p, w.subject, stored, r.ingressRef(rt.seq))
		rt.setRecords(w.stream, p, due)
		rt.out.Header[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(w.expected, 10)}
	}
}
