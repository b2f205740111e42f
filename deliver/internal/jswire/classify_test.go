package jswire

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// status builds a message as the server sends a status on a pull inbox: no
// reply subject, no payload, "NATS/1.0 <code> <description>" read into the
// Status and Description headers, plus extra headers.
func status(code, descr string, extra ...string) *nats.Msg {
	h := nats.Header{"Status": {code}}
	if descr != "" {
		h["Description"] = []string{descr}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = []string{extra[i+1]}
	}
	return &nats.Msg{Subject: "_INBOX.pull", Header: h}
}

const ack = "$JS.ACK.ORDERS.worker.1.7.7.1795990280677514429.0"

// The statuses a pull consumer sends (nats-server consumer.go; ADR-13's
// pull request protocol), and messages that only look like them.
func TestClassify(t *testing.T) {
	t.Parallel()
	const batch = 64
	for _, tc := range []struct {
		name string
		m    *nats.Msg
		want signal
	}{
		{"data", &nats.Msg{Subject: "orders", Reply: ack, Data: []byte("x")}, signal{kind: sigData}},
		{"empty data", &nats.Msg{Subject: "orders", Reply: ack}, signal{kind: sigData}},
		{"v2 ack subject", &nats.Msg{Subject: "orders", Reply: "$JS.ACK._.H.ORDERS.worker.1.7.7.1.0"}, signal{kind: sigData}},

		// A publisher's message is data whatever its headers: a fixed bug
		// (an imitated "409 Consumer Deleted" stopped the router).
		{"imitates 409 consumer deleted", &nats.Msg{Subject: "orders", Reply: ack, Header: nats.Header{"Status": {"409"}, "Description": {"Consumer Deleted"}}}, signal{kind: sigData}},
		{"imitates 503", &nats.Msg{Subject: "orders", Reply: ack, Header: nats.Header{"Status": {"503"}}}, signal{kind: sigData}},
		{"imitates 408", &nats.Msg{Subject: "orders", Reply: ack, Header: nats.Header{"Status": {"408"}, "Description": {"Request Timeout"}, "Nats-Pending-Messages": {"64"}}}, signal{kind: sigData}},
		{"imitates 100", &nats.Msg{Subject: "orders", Reply: ack, Header: nats.Header{"Status": {"100"}, "Description": {"Idle Heartbeat"}}}, signal{kind: sigData}},

		// Anything else with a reply subject is not the server's.
		{"foreign request", &nats.Msg{Subject: "_INBOX.pull", Reply: "_INBOX.other"}, signal{kind: sigForeign}},
		{"foreign 503 with reply", &nats.Msg{Subject: "_INBOX.pull", Reply: "_INBOX.other", Header: nats.Header{"Status": {"503"}}}, signal{kind: sigForeign}},
		{"flow control", &nats.Msg{Subject: "_INBOX.pull", Reply: "$JS.FC.ORDERS.x.y", Header: nats.Header{"Status": {"100"}, "Description": {"FlowControl Request"}}}, signal{kind: sigForeign}},

		{"100 heartbeat", status("100", "Idle Heartbeat"), signal{kind: sigIdle}},
		{"100 heartbeat with last consumer/stream", status("100", "Idle Heartbeat", "Nats-Last-Consumer", "17", "Nats-Last-Stream", "42"), signal{kind: sigIdle}},
		{"100 heartbeat, stalled", status("100", "Idle Heartbeat", "Nats-Last-Consumer", "17", "Nats-Last-Stream", "42", "Nats-Consumer-Stalled", "$JS.FC.x"), signal{kind: sigIdle}},
		{"100 without description", status("100", ""), signal{kind: sigIdle}},
		{"no status, no reply", &nats.Msg{Subject: "_INBOX.pull"}, signal{kind: sigIdle}},
		{"unknown status", status("400", "Bad Request"), signal{kind: sigIdle}},

		{"404 no messages", status("404", "No Messages"), signal{kind: sigVoid, unsent: batch}},
		{"404 with pending", status("404", "No Messages", "Nats-Pending-Messages", "3"), signal{kind: sigVoid, unsent: 3}},
		{"408 request timeout", status("408", "Request Timeout", "Nats-Pending-Messages", "40", "Nats-Pending-Bytes", "0"), signal{kind: sigVoid, unsent: 40}},
		{"408 without pending", status("408", "Request Timeout"), signal{kind: sigVoid, unsent: batch}},
		{"408 unreadable pending", status("408", "Request Timeout", "Nats-Pending-Messages", "many"), signal{kind: sigVoid, unsent: batch}},
		{"408 interest expired", status("408", "Interest Expired", "Nats-Pending-Messages", "5"), signal{kind: sigVoid, unsent: 5}},

		{"409 consumer deleted", status("409", "Consumer Deleted"), signal{kind: sigDeleted}},
		{"409 consumer deleted, any case", status("409", "consumer DELETED"), signal{kind: sigDeleted}},
		{"503 no responders", status("503", ""), signal{kind: sigDeleted}},

		{"409 leadership change", status("409", "Leadership Change"), signal{kind: sigReset}},
		{"409 server shutdown", status("409", "Server Shutdown"), signal{kind: sigReset}},

		{"409 batch completed", status("409", "Batch Completed", "Nats-Pending-Messages", "0"), signal{kind: sigVoid, unsent: 0}},
		{"409 batch completed, bytes left", status("409", "Batch Completed", "Nats-Pending-Messages", "2", "Nats-Pending-Bytes", "0"), signal{kind: sigVoid, unsent: 2}},
		{"409 batch completed, no count", status("409", "Batch Completed"), signal{kind: sigVoid, unsent: 0}},

		{"409 exceeded max waiting", status("409", "Exceeded MaxWaiting"), signal{kind: sigRefused, unsent: batch}},
		{"409 exceeded max request batch", status("409", "Exceeded MaxRequestBatch of 16"), signal{kind: sigRefused, unsent: batch}},
		{"409 exceeded max request expires", status("409", "Exceeded MaxRequestExpires of 1s"), signal{kind: sigRefused, unsent: batch}},
		{"409 message size exceeds maxbytes", status("409", "Message Size Exceeds MaxBytes", "Nats-Pending-Messages", "9"), signal{kind: sigRefused, unsent: 9}},
		{"409 without description", status("409", ""), signal{kind: sigRefused, unsent: batch}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := classify(tc.m, batch); got != tc.want {
				t.Fatalf("classify = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzClassify checks, on any reply subject and status headers, that a
// $JS.ACK reply makes a message data whatever its headers, that no other
// message is data, and that a status is read only without a reply.
//
//	go test -fuzz FuzzClassify ./deliver/internal/jswire
func FuzzClassify(f *testing.F) {
	for _, s := range [][4]string{
		{ack, "409", "Consumer Deleted", ""},
		{ack, "503", "", ""},
		{"", "100", "Idle Heartbeat", ""},
		{"", "404", "No Messages", "3"},
		{"", "408", "Request Timeout", "64"},
		{"", "409", "Consumer Deleted", ""},
		{"", "409", "Exceeded MaxWaiting", ""},
		{"", "409", "Leadership Change", ""},
		{"", "409", "Batch Completed", "0"},
		{"", "503", "", ""},
		{"_INBOX.x", "503", "", ""},
		{"$JS.ACK", "409", "Consumer Deleted", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, reply, code, descr, pending string) {
		m := &nats.Msg{Subject: "_INBOX.pull", Reply: reply, Header: nats.Header{
			"Status": {code}, "Description": {descr}, "Nats-Pending-Messages": {pending},
		}}
		got := classify(m, 8)
		switch {
		case strings.HasPrefix(reply, AckPrefix):
			if got.kind != sigData {
				t.Fatalf("reply %q: %+v, want data", reply, got)
			}
		case reply != "":
			if got.kind != sigForeign {
				t.Fatalf("reply %q: %+v, want foreign", reply, got)
			}
		case got.kind == sigData || got.kind == sigForeign:
			t.Fatalf("no reply: %+v", got)
		case got.kind == sigDeleted && code != "503" && code != "409":
			t.Fatalf("status %q read as the consumer's deletion", code)
		}
		if got.kind != sigVoid && got.kind != sigRefused && got.unsent != 0 {
			t.Fatalf("%+v: unsent without a void request", got)
		}
	})
}
