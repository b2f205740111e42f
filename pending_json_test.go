package delayd

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/delayd/delayd/contract"
)

// TestPendingMsgJSON: a PendingMsg's JSON (delayctl ls --json prints it)
// is the list API's item's, with the same names and the same fields left
// out when empty (a zero enqueue time among them).
func TestPendingMsgJSON(t *testing.T) {
	t.Parallel()
	due := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	for _, it := range []contract.PendingItem{
		{ID: "remind-42", Due: due, Enqueued: due.Add(-time.Hour), Target: "orders.remind", Level: "1h", Stream: "DELAYD_1H",
			Seq: 1234, Hops: 1, Size: 7, MergeKey: "k", Headers: map[string][]string{"X-Trace": {"a1"}}, Data: []byte("payload")},
		{ID: "seq:5", Due: due, Target: "orders.remind", Level: "0s", Stream: "DELAYD_0S", Seq: 1},
	} {
		want, _ := json.Marshal(it)
		got, err := json.Marshal(PendingMsg{
			ID: it.ID, Due: it.Due, Enqueued: it.Enqueued, Target: it.Target, Level: it.Level, Stream: it.Stream,
			Seq: it.Seq, Hops: it.Hops, Size: it.Size, MergeKey: it.MergeKey, Header: it.Headers, Data: it.Data,
		})
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("PendingMsg JSON\n%s\nwant the list item's\n%s", got, want)
		}
	}
}
