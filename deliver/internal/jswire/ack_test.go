package jswire

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// The two reply-subject formats, as nats-server 2.15 writes them
// (consumer.go ackReply: jsAckT / jsAckTv2 + ".%d.%d.%d.%d.%d") and as
// nats.go's jetstream reads them (internal/parser: 9 tokens, or 11 and
// more, the 12th a random token a later server may add).
func TestParseAck(t *testing.T) {
	t.Parallel()
	const ts = 1795990280677514429
	for _, tc := range []struct {
		name  string
		reply string
		ok    bool
		want  AckMeta
	}{
		{"v1, 9 tokens", "$JS.ACK.ORDERS.worker.3.4242.17.1795990280677514429.0", true, AckMeta{StreamSeq: 4242, Stored: time.Unix(0, ts), Delivered: 3, ConsumerSeq: 17}},
		{"v2, 11 tokens", "$JS.ACK._.ACCHASH.ORDERS.worker.1.4242.17.1795990280677514429.5", true, AckMeta{StreamSeq: 4242, Stored: time.Unix(0, ts), Delivered: 1, ConsumerSeq: 17}},
		{"v2 with domain, 12 tokens", "$JS.ACK.hub.ACCHASH.ORDERS.worker.2.7.7.1795990280677514429.0.Xz9q", true, AckMeta{StreamSeq: 7, Stored: time.Unix(0, ts), Delivered: 2, ConsumerSeq: 7}},
		{"delayd's ingress consumer", "$JS.ACK.DELAYD_INGRESS.delayd-router.1.1.1.1.0", true, AckMeta{StreamSeq: 1, Stored: time.Unix(0, 1), Delivered: 1, ConsumerSeq: 1}},
		{"largest sequence", "$JS.ACK.S.C.1.18446744073709551615.1.0.0", true, AckMeta{StreamSeq: 1<<64 - 1, Stored: time.Unix(0, 0), Delivered: 1, ConsumerSeq: 1}},
		// cseq and pending are not read.
		{"cseq not a number: 0; pending not read", "$JS.ACK.S.C.1.2.x.3.y", true, AckMeta{StreamSeq: 2, Stored: time.Unix(0, 3), Delivered: 1}},

		{"empty", "", false, AckMeta{}},
		{"an inbox", "_INBOX.abc.def", false, AckMeta{}},
		{"prefix only", "$JS.ACK.", false, AckMeta{}},
		{"lower-case prefix", "$js.ack.S.C.1.2.3.4.5", false, AckMeta{}},
		{"flow control subject", "$JS.FC.S.C.1.2.3.4.5", false, AckMeta{}},
		{"8 tokens", "$JS.ACK.S.C.1.2.3.4", false, AckMeta{}},
		{"10 tokens", "$JS.ACK.S.C.1.2.3.4.5.6", false, AckMeta{}},
		// Like nats.go: a v2 subject is valid with 11 tokens or more, so a
		// token a later server adds does not make every message unreadable.
		{"13 tokens", "$JS.ACK.d.h.S.C.1.2.3.4.5.r.x", true, AckMeta{StreamSeq: 2, Stored: time.Unix(0, 4), Delivered: 1, ConsumerSeq: 3}},
		{"14 tokens", "$JS.ACK.d.h.S.C.1.2.3.4.5.r.x.y", true, AckMeta{StreamSeq: 2, Stored: time.Unix(0, 4), Delivered: 1, ConsumerSeq: 3}},
		{"delivered not a number", "$JS.ACK.S.C.one.2.3.4.5", false, AckMeta{}},
		{"sseq not a number", "$JS.ACK.S.C.1.two.3.4.5", false, AckMeta{}},
		{"ts not a number", "$JS.ACK.S.C.1.2.3.four.5", false, AckMeta{}},
		{"negative sseq", "$JS.ACK.S.C.1.-2.3.4.5", false, AckMeta{}},
		{"sseq overflows", "$JS.ACK.S.C.1.18446744073709551616.3.4.5", false, AckMeta{}},
		{"empty sseq", "$JS.ACK.S.C.1..3.4.5", false, AckMeta{}},
		{"v2 sseq not a number", "$JS.ACK._.H.S.C.1.x.3.4.5", false, AckMeta{}},
		// A v1 subject's fields read at v2's positions, or the reverse,
		// would be caught by the token count; these are the near misses.
		{"v1 with a dotted consumer", "$JS.ACK.S.C.D.1.2.3.4.5", false, AckMeta{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ParseAck(tc.reply)
			if ok != tc.ok || got.StreamSeq != tc.want.StreamSeq || got.Delivered != tc.want.Delivered || !got.Stored.Equal(tc.want.Stored) {
				t.Fatalf("ParseAck(%q) = %+v, %v; want %+v, %v", tc.reply, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// refParseAck is an independent reading of the same contract, by
// strings.Split, for the fuzz test to compare with.
func refParseAck(reply string) (AckMeta, bool) {
	tok := strings.Split(reply, ".")
	if len(tok) < 2 || tok[0] != "$JS" || tok[1] != "ACK" {
		return AckMeta{}, false
	}
	var off int
	switch n := len(tok); {
	case n == 9:
		off = 2
	case n >= 11:
		off = 4
	default:
		return AckMeta{}, false
	}
	dc, err1 := strconv.ParseUint(tok[off+2], 10, 64)
	sseq, err2 := strconv.ParseUint(tok[off+3], 10, 64)
	ts, err3 := strconv.ParseInt(tok[off+5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return AckMeta{}, false
	}
	cseq, _ := strconv.ParseUint(tok[off+4], 10, 64)
	return AckMeta{StreamSeq: sseq, Stored: time.Unix(0, ts), Delivered: dc, ConsumerSeq: cseq}, true
}

// FuzzParseAck checks ParseAck against refParseAck on any input, and that a
// subject formatted from its fields reads back as them in both formats.
//
//	go test -fuzz FuzzParseAck ./deliver/internal/jswire
func FuzzParseAck(f *testing.F) {
	for _, s := range []string{
		"$JS.ACK.ORDERS.worker.3.4242.17.1795990280677514429.0",
		"$JS.ACK._.ACCHASH.ORDERS.worker.1.4242.17.1795990280677514429.5",
		"$JS.ACK.hub.ACCHASH.ORDERS.worker.2.7.7.1795990280677514429.0.Xz9q",
		"$JS.ACK.S.C.1.2.3.4.5.6",
		"$JS.ACK.d.h.S.C.1.2.3.4.5.r.x",
		"$JS.ACK.S.C.1.-2.3.4.5",
		"$JS.ACK.",
		"$JS.ACK",
		"_INBOX.x",
		"",
	} {
		f.Add(s, uint64(4242), uint64(3), int64(1795990280677514429))
	}
	f.Fuzz(func(t *testing.T, reply string, sseq, dc uint64, ts int64) {
		got, ok := ParseAck(reply)
		want, wantOK := refParseAck(reply)
		if ok != wantOK || got.StreamSeq != want.StreamSeq || got.Delivered != want.Delivered || got.ConsumerSeq != want.ConsumerSeq || !got.Stored.Equal(want.Stored) {
			t.Fatalf("ParseAck(%q) = %+v, %v; reference %+v, %v", reply, got, ok, want, wantOK)
		}
		n := func(v uint64) string { return strconv.FormatUint(v, 10) }
		fields := n(dc) + "." + n(sseq) + ".9." + strconv.FormatInt(ts, 10) + ".0"
		for _, s := range []string{
			"$JS.ACK.S.C." + fields,
			"$JS.ACK._.H.S.C." + fields,
			"$JS.ACK.d.H.S.C." + fields + ".r",
		} {
			m, ok := ParseAck(s)
			if !ok || m.StreamSeq != sseq || m.Delivered != dc || m.ConsumerSeq != 9 || m.Stored.UnixNano() != ts {
				t.Fatalf("ParseAck(%q) = %+v, %v", s, m, ok)
			}
		}
	})
}

// BenchmarkParseAck measures reading one data message's metadata, as the
// router and the scanners do for every message, in both formats.
func BenchmarkParseAck(b *testing.B) {
	for _, reply := range []string{
		"$JS.ACK.DELAYD_INGRESS.delayd-router.1.4242.4242.1795990280677514429.0",
		"$JS.ACK._.ACCHASH.DELAYD_INGRESS.delayd-router.1.4242.4242.1795990280677514429.0",
	} {
		b.Run(strconv.Itoa(strings.Count(reply, ".")+1)+"tokens", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := ParseAck(reply); !ok {
					b.Fatal("bad ack subject")
				}
			}
		})
	}
}
