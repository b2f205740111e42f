package contract

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestPendingItemTimes: a list item's due and enqueued times are written
// as the Delay-Due-At and Delay-Enqueued-At headers are (TimeLayout: UTC,
// nine fraction digits, trailing zeros kept), an unset enqueued time is
// left out, and the item reads back equal.
func TestPendingItemTimes(t *testing.T) {
	if n := reflect.TypeOf(PendingItem{}).NumField(); n != 12 {
		t.Fatalf("PendingItem has %d fields, its MarshalJSON writes 12: write the new one there too", n)
	}
	due := time.Date(2026, 12, 3, 9, 26, 24, 815119450, time.FixedZone("x", 3600))
	it := PendingItem{ID: "o1", Due: due, Target: "orders.close", Level: "1m", Stream: "DELAYD_1M", Seq: 7, Size: 2}
	b, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"due":"` + FormatTime(due) + `"`; !strings.Contains(string(b), want) || FormatTime(due) != "2026-12-03T08:26:24.815119450Z" {
		t.Fatalf("item JSON %s; want it to hold %s", b, want)
	}
	if strings.Contains(string(b), "enqueued") {
		t.Fatalf("item JSON %s holds an unset enqueued time", b)
	}
	it.Enqueued = due.Add(-time.Minute)
	b, err = json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"enqueued":"` + FormatTime(it.Enqueued) + `"`; !strings.Contains(string(b), want) {
		t.Fatalf("item JSON %s; want it to hold %s", b, want)
	}
	var back PendingItem
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Due.Equal(it.Due) || !back.Enqueued.Equal(it.Enqueued) || back.ID != it.ID || back.Seq != it.Seq || back.Stream != it.Stream {
		t.Fatalf("read back %+v, want %+v", back, it)
	}
}

// TestPendingReplyJSON: a reply's next_due is written as the items' times
// are, and total and next_due are left out when not given (a later page).
func TestPendingReplyJSON(t *testing.T) {
	if n := reflect.TypeOf(PendingReply{}).NumField(); n != 6 {
		t.Fatalf("PendingReply has %d fields, its MarshalJSON writes 6: write the new one there too", n)
	}
	total := 0
	due := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	b, err := json.Marshal(PendingReply{Target: "orders.x", Total: &total, NextDue: due, Items: []PendingItem{}})
	if want := `{"target":"orders.x","total":0,"next_due":"2026-12-03T09:00:00.000000000Z","items":[]}`; err != nil || string(b) != want {
		t.Errorf("first page JSON %s, %v; want %s", b, err, want)
	}
	var back PendingReply
	if err := json.Unmarshal(b, &back); err != nil || back.Total == nil || *back.Total != 0 || !back.NextDue.Equal(due) {
		t.Errorf("read back %+v, %v", back, err)
	}
	if b, _ := json.Marshal(PendingReply{Target: "orders.x", Items: []PendingItem{}, Next: "n"}); string(b) != `{"target":"orders.x","items":[],"next":"n"}` {
		t.Errorf("later page JSON %s", b)
	}
}
