package deliver

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestListIDsCancel: every id a list gives is one cancel takes
// (SPEC "Pending messages": `id`, the id cancel and reschedule accept),
// even a publisher's decimal Nats-Msg-Id that is also the ingress
// sequence of another message of the same target published without an
// id: cancel reads a bare decimal id both ways and refuses it as
// ambiguous (400), so the list must give it in a form cancel reads one
// way ("id:N").
func TestListIDsCancel(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: "delay.tgt.ids", Data: []byte("no id"), Header: nats.Header{contract.HeaderLevel: {"2"}}})
	if err != nil {
		t.Fatal(err)
	}
	decimal := strconv.FormatUint(ack.Sequence, 10)
	b.publishTo("tgt.ids", "decimal id", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {decimal}})
	r := b.list("tgt.ids", contract.PendingRequest{})
	if len(r.Items) != 2 {
		t.Fatalf("list of tgt.ids: %q, want two items", ids(r.Items))
	}
	for _, it := range r.Items {
		m, err := b.nc.Request(contract.CancelSubjectFor("tgt.ids"), []byte(it.ID), 30*time.Second)
		if err != nil {
			t.Fatalf("cancel %q: %v", it.ID, err)
		}
		if string(m.Data) != contract.CancelReplyCancelled {
			t.Errorf("cancel of listed id %q (ingress sequence of the other: %s): %q, code %s; want cancelled", it.ID, decimal, m.Data, m.Header.Get(contract.HeaderStatus))
		}
	}
}
