package deliver

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
	"github.com/delayd/delayd/levels"
)

// listLevels is the list tests' level table: long levels, so that no
// message listed hops during a test (a hop in flight may be missed by a
// walk: docs/pending.md §1.6), and a 1 s level for one that is delivered.
const listLevels = "1s 1h 2h"

// list sends one list request for target and returns its reply; the
// request must be answered 200.
func (b *ownerBundle) list(target string, req contract.PendingRequest) contract.PendingReply {
	b.t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		b.t.Fatal(err)
	}
	m, err := b.nc.Request(contract.PendingSubjectFor(target), data, 30*time.Second)
	if err != nil {
		b.t.Fatalf("list %s: %v", target, err)
	}
	if code := m.Header.Get(contract.HeaderStatus); code != "200" {
		b.t.Fatalf("list %s: code %s: %s", target, code, m.Data)
	}
	var reply contract.PendingReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		b.t.Fatalf("list %s: %v: %s", target, err, m.Data)
	}
	return reply
}

// listAll walks every page of target's list with limit, and returns the
// items in the order the pages gave them.
func (b *ownerBundle) listAll(target string, limit int) []contract.PendingItem {
	b.t.Helper()
	var (
		out    []contract.PendingItem
		cursor string
	)
	for pages := 0; ; pages++ {
		if pages > 100 {
			b.t.Fatalf("list %s, limit %d: more than 100 pages", target, limit)
		}
		r := b.list(target, contract.PendingRequest{Limit: limit, Cursor: cursor})
		if len(r.Items) > limit {
			b.t.Fatalf("list %s: %d items, limit %d", target, len(r.Items), limit)
		}
		out = append(out, r.Items...)
		if r.Next == "" {
			return out
		}
		cursor = r.Next
	}
}

// totalOf is a reply's total as text, "none" when it has none.
func totalOf(r contract.PendingReply) string {
	if r.Total == nil {
		return "none"
	}
	return strconv.Itoa(*r.Total)
}

func ids(items []contract.PendingItem) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}

// listSetup starts one replica with listLevels and publishes the
// messages of TestList*: list.a's in an order unlike their due order,
// with list.b's between them at the same delays. It returns list.a's ids
// in due order. The one without a publisher id is listed as
// "seq:<its ingress sequence>".
func listSetup(t *testing.T) (*ownerBundle, []string) {
	b := setupOwners(t)
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	deliverAt := time.Now().Add(3 * time.Hour).UTC().Format(time.RFC3339)
	type msg struct{ id, key, value string }
	// Stored order in DELAYD_1H: a4 (due 1h59m), a3, a8, a1 (1h), a2;
	// in DELAYD_2H: a6 (2h30m), a7, a5 (2h). Due order below.
	for _, m := range []msg{
		{"a4", contract.HeaderDuration, "1h59m"}, {"b1", contract.HeaderLevel, "2"},
		{"a6", contract.HeaderDuration, "2h30m"}, {"a7", contract.HeaderDeliverAt, deliverAt},
		{"a3", contract.HeaderDuration, "1h30m"}, {"b2", contract.HeaderDuration, "1h5m"},
		{"", contract.HeaderDuration, "1h20m"}, {"a1", contract.HeaderLevel, "2"},
		{"a2", contract.HeaderDuration, "1h10m"}, {"b3", contract.HeaderLevel, "3"},
		{"a5", contract.HeaderLevel, "3"},
	} {
		target, h := "tgt.list.a", nats.Header{m.key: {m.value}, "X-Trace": {"t-" + m.id}}
		if strings.HasPrefix(m.id, "b") {
			target = "tgt.list.b"
		}
		if m.id != "" {
			h.Set(contract.HeaderNatsMsgID, m.id)
		}
		b.publishTo(target, "payload "+m.id, h)
	}
	seq := b.ingressSeqOf("payload ")
	return b, []string{"a1", "a2", seq, "a3", "a4", "a5", "a6", "a7"}
}

// ingressSeqOf returns "seq:<n>" for the ingress sequence of the message
// published without an id (payload "payload "): its index key, read back
// from the level stream it waits in.
func (b *ownerBundle) ingressSeqOf(payload string) string {
	b.t.Helper()
	b.waitRouted()
	for _, m := range b.levelMsgs(levels.StreamName(time.Hour)) {
		if string(m.Data) == payload {
			ref := m.Header.Get("Delayd-Ingress")
			return "seq:" + ref[strings.LastIndex(ref, "-")+1:]
		}
	}
	b.t.Fatalf("no level message with payload %q", payload)
	return ""
}

// TestListOneTarget: a list of list.a holds list.a's messages only (none
// of list.b's, published between them at the same delays), each once, in
// due order across two level streams whose stored order is not the due
// order (a cascading 1h59m message stored in the 1h level before a
// Delay-Level one due at 1h), each with its final due (not the hop's),
// its user headers and not delayd's, and its payload only on request.
func TestListOneTarget(t *testing.T) {
	t.Parallel()
	b, want := listSetup(t)
	r := b.list("tgt.list.a", contract.PendingRequest{})
	if got := ids(r.Items); !slices.Equal(got, want) {
		t.Fatalf("list of tgt.list.a: %q, want %q", got, want)
	}
	if r.Next != "" {
		t.Errorf("one page holds all: next %q, want none", r.Next)
	}
	// The first page counts the target's messages over every level, and
	// gives the least due: list.a's only, not list.b's.
	if r.Total == nil || *r.Total != len(want) || !r.NextDue.Equal(r.Items[0].Due) {
		t.Errorf("first page: total %s, next_due %s; want %d and %s", totalOf(r), r.NextDue, len(want), r.Items[0].Due)
	}
	if r2 := b.list("tgt.list.a", contract.PendingRequest{Limit: 2}); r2.Total == nil || *r2.Total != len(want) || !r2.NextDue.Equal(r.Items[0].Due) {
		t.Errorf("first page of 2: total %s, next_due %s; want %d and %s", totalOf(r2), r2.NextDue, len(want), r.Items[0].Due)
	} else if r3 := b.list("tgt.list.a", contract.PendingRequest{Limit: 2, Cursor: r2.Next}); r3.Total != nil || !r3.NextDue.IsZero() {
		t.Errorf("second page: total %s, next_due %s; want neither", totalOf(r3), r3.NextDue)
	}
	// The due filter does not change them.
	if rf := b.list("tgt.list.a", contract.PendingRequest{DueAfter: r.Items[len(r.Items)-1].Due}); len(rf.Items) != 0 || rf.Total == nil || *rf.Total != len(want) || !rf.NextDue.Equal(r.Items[0].Due) {
		t.Errorf("first page due after the last: %d items, total %s, next_due %s; want none, %d and %s", len(rf.Items), totalOf(rf), rf.NextDue, len(want), r.Items[0].Due)
	}
	byID := make(map[string]contract.PendingItem)
	for _, it := range r.Items {
		byID[it.ID] = it
		if it.Target != "tgt.list.a" || it.Headers["X-Trace"] == nil || len(it.Data) != 0 {
			t.Errorf("item %s: target %q, headers %v, data %q", it.ID, it.Target, it.Headers, it.Data)
		}
		for k := range it.Headers {
			if contract.IsInternalHeader(k) || k == contract.HeaderDueAt || k == contract.HeaderEnqueuedAt {
				t.Errorf("item %s carries header %s", it.ID, k)
			}
		}
	}
	// a4 (Delay-Duration 1h59m) waits in the 1h level: its hop is due at
	// 1h, its delivery at 1h59m, 59 minutes after a1's (Delay-Level 2, 1h),
	// published within seconds of it.
	if gap := byID["a4"].Due.Sub(byID["a1"].Due); gap < 58*time.Minute || gap > time.Hour {
		t.Errorf("a4 due %s, a1 due %s: want a4's final due, 59m after a1's", byID["a4"].Due, byID["a1"].Due)
	}
	if byID["a4"].Stream != levels.StreamName(time.Hour) || byID["a6"].Stream != levels.StreamName(2*time.Hour) {
		t.Errorf("a4 in %s, a6 in %s", byID["a4"].Stream, byID["a6"].Stream)
	}
	rb := b.list("tgt.list.b", contract.PendingRequest{Payload: true})
	if got := ids(rb.Items); !slices.Equal(got, []string{"b1", "b2", "b3"}) {
		t.Errorf("list of tgt.list.b: %q, want b1 b2 b3", got)
	}
	for _, it := range rb.Items {
		if string(it.Data) != "payload "+it.ID {
			t.Errorf("item %s with payload: data %q", it.ID, it.Data)
		}
	}
	if r := b.list("tgt.list", contract.PendingRequest{}); len(r.Items) != 0 {
		t.Errorf("list of tgt.list (no messages, a prefix of both): %q", ids(r.Items))
	}
}

// TestListPaging: walking the pages with limits 1, 2 and 3 gives every
// message of list.a once, in due order; the due filter keeps what is
// inside its exclusive bounds.
func TestListPaging(t *testing.T) {
	t.Parallel()
	b, want := listSetup(t)
	for _, limit := range []int{1, 2, 3} {
		if got := ids(b.listAll("tgt.list.a", limit)); !slices.Equal(got, want) {
			t.Errorf("pages of %d: %q, want %q", limit, got, want)
		}
	}
	all := b.list("tgt.list.a", contract.PendingRequest{}).Items
	r := b.list("tgt.list.a", contract.PendingRequest{DueAfter: all[1].Due, DueBefore: all[5].Due})
	if got := ids(r.Items); !slices.Equal(got, want[2:5]) {
		t.Errorf("due in (%s, %s): %q, want %q", all[1].Due, all[5].Due, got, want[2:5])
	}
	for _, bad := range []string{`{"limit":1001}`, `{"limit":-1}`, `{"cursor":"x"}`, `[`} {
		m, err := b.nc.Request(contract.PendingSubjectFor("tgt.list.a"), []byte(bad), 30*time.Second)
		if err != nil || m.Header.Get(contract.HeaderStatus) != "400" {
			t.Errorf("request %s: %v, want a 400 answer", bad, err)
		}
	}
}

// TestListCancelledAndDelivered: a cancelled message is not listed (its
// level's owner sifts it out), and a delivered one is not listed once it
// was delivered.
func TestListCancelledAndDelivered(t *testing.T) {
	t.Parallel()
	b, want := listSetup(t)
	b.publishTo("tgt.list.a", "soon", nats.Header{contract.HeaderLevel: {"1"}, contract.HeaderNatsMsgID: {"soon"}})
	m, err := b.nc.Request(contract.CancelSubjectFor("tgt.list.a"), []byte("a3"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyCancelled {
		t.Fatalf("cancel a3: %v %v", m, err)
	}
	b.waitPayload("soon", time.Minute)
	want = slices.DeleteFunc(want, func(id string) bool { return id == "a3" })
	for _, limit := range []int{100, 2} {
		if got := ids(b.listAll("tgt.list.a", limit)); !slices.Equal(got, want) {
			t.Errorf("pages of %d after a3's cancel and soon's delivery: %q, want %q", limit, got, want)
		}
	}
	// The total counts neither: the delivered one is below its level's
	// passed, the cancelled one's tombstone is subtracted.
	if r := b.list("tgt.list.a", contract.PendingRequest{}); r.Total == nil || *r.Total != len(want) {
		t.Errorf("total after a3's cancel and soon's delivery: %s, want %d", totalOf(r), len(want))
	}
}

// TestListDecidedByOwner: a list taken by a replica that owns no level
// asks the levels' owner on the other replica to sift (decide op "sift"):
// a message cancelled there is not listed, the others are.
func TestListDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	_, c := b.splitOwners(listLevels)
	for _, id := range []string{"r1", "r2", "r3"} {
		b.publishTo("tgt.r", "payload "+id, nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {id}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if answer, _, err := c.svc.decideID(ctx, reader, "r2", "tgt.r", time.Time{}, false); err != nil || answer != level.AnswerCancelled {
		t.Fatalf("cancel of r2 through B: %v %v", answer, err)
	}
	r, err := c.svc.parts.cancelAPI.List(ctx, reader, "tgt.r", nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(r.Items); !slices.Equal(got, []string{"r1", "r3"}) {
		t.Errorf("list of tgt.r through B: %q, want r1 r3", got)
	}
}

// TestListGuideForms sends the `nats req` forms of docs/guide.md's
// "Pending messages" section, as written there: each is answered 200 and
// lists the one message pending for orders.remind.
func TestListGuideForms(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Pending messages\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var forms [][2]string // subject, payload
	for line := range strings.Lines(section) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "nats req ")
		if !ok {
			continue
		}
		subject, quoted, _ := strings.Cut(rest, " ")
		payload, ok := strings.CutPrefix(quoted, "'")
		if payload, ok = strings.CutSuffix(payload, "'"); !ok {
			t.Fatalf("guide form %q: want nats req SUBJECT 'PAYLOAD'", line)
		}
		forms = append(forms, [2]string{subject, payload})
	}
	if len(forms) < 2 {
		t.Fatalf("docs/guide.md#pending-messages: %d nats req forms, want the plain one and one with options", len(forms))
	}
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	b.publishTo("orders.remind", "meeting", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"remind-42"}})
	for _, f := range forms {
		m, err := b.nc.Request(f[0], []byte(f[1]), 30*time.Second)
		if err != nil {
			t.Fatalf("nats req %s '%s': %v", f[0], f[1], err)
		}
		var r contract.PendingReply
		if code := m.Header.Get(contract.HeaderStatus); code != "200" || json.Unmarshal(m.Data, &r) != nil || len(r.Items) != 1 || r.Items[0].ID != "remind-42" {
			t.Errorf("nats req %s '%s': code %s, %s", f[0], f[1], code, m.Data)
		}
	}
}

// TestListOperatorForm: a request to delayd.api.pending itself (the
// operator form) lists across the targets its subject matches: with
// "orders.>", orders.a's and orders.b's messages in due order, each with
// its target, and none of billing.x's; total and next_due over the
// subject. Without a subject it lists every target, and its total counts
// no router epoch marker. A bad subject filter, or a subject in the
// scoped form, is refused.
func TestListOperatorForm(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	for _, m := range []struct{ target, id, level string }{
		{"orders.a", "oa1", "3"}, {"billing.x", "bx1", "2"}, {"orders.b", "ob1", "2"},
		{"orders.a", "oa2", "2"}, {"billing.x", "bx2", "3"},
	} {
		b.publishTo(m.target, "payload "+m.id, nats.Header{contract.HeaderLevel: {m.level}, contract.HeaderNatsMsgID: {m.id}})
	}
	any := func(req contract.PendingRequest) contract.PendingReply {
		t.Helper()
		data, _ := json.Marshal(req)
		m, err := b.nc.Request(contract.PendingSubject, data, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r contract.PendingReply
		if code := m.Header.Get(contract.HeaderStatus); code != "200" || json.Unmarshal(m.Data, &r) != nil {
			t.Fatalf("operator list %+v: code %s, %s", req, code, m.Data)
		}
		return r
	}
	r := any(contract.PendingRequest{Subject: "orders.>"})
	targets := make(map[string]string)
	for _, it := range r.Items {
		targets[it.ID] = it.Target
	}
	if got := ids(r.Items); !slices.Equal(got, []string{"ob1", "oa2", "oa1"}) && !slices.Equal(got, []string{"oa2", "ob1", "oa1"}) {
		t.Errorf("operator list of orders.>: %q, want ob1 and oa2 (due 1h), then oa1", got)
	}
	if targets["oa1"] != "orders.a" || targets["ob1"] != "orders.b" || r.Subject != "orders.>" || r.Target != "" {
		t.Errorf("operator list of orders.>: targets %v, subject %q, target %q", targets, r.Subject, r.Target)
	}
	if r.Total == nil || *r.Total != 3 || len(r.Items) == 0 || !r.NextDue.Equal(r.Items[0].Due) {
		t.Errorf("operator list of orders.>: total %s, next_due %s; want 3 and the first item's", totalOf(r), r.NextDue)
	}
	if r := any(contract.PendingRequest{}); len(r.Items) != 5 || r.Total == nil || *r.Total != 5 || r.Subject != ">" {
		t.Errorf("operator list of every target: %q, total %s, subject %q; want 5 and 5, >", ids(r.Items), totalOf(r), r.Subject)
	}
	for _, c := range []struct{ subject, payload, reason string }{
		{contract.PendingSubject, `{"subject":"orders.>.x"}`, "not the last token"},
		{contract.PendingSubject, `{"subject":"orders.a*"}`, "wildcard inside"},
		{contract.PendingSubjectFor("orders.a"), `{"subject":"orders.>"}`, "operator form"},
	} {
		m, err := b.nc.Request(c.subject, []byte(c.payload), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if body := string(m.Data); m.Header.Get(contract.HeaderStatus) != "400" || !strings.Contains(body, c.reason) {
			t.Errorf("%s %s: code %s, %q; want 400 naming %q", c.subject, c.payload, m.Header.Get(contract.HeaderStatus), body, c.reason)
		}
	}
}
