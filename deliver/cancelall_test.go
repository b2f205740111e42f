package deliver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/levels"
)

// cancelAllLevels: one 6 s level for the messages of TestCancelAll*, so
// that none hops (a hop in flight may be missed by a walk:
// docs/pending.md §1.6) and each is due soon after the request.
const cancelAllLevels = "1s 6s"

// cancelAll sends one cancel-all request for target and returns its reply;
// the request must be answered 200.
func (b *ownerBundle) cancelAll(target string) contract.CancelAllReply {
	b.t.Helper()
	m, err := b.nc.Request(contract.CancelAllSubjectFor(target), nil, time.Minute)
	if err != nil {
		b.t.Fatalf("cancel-all %s: %v", target, err)
	}
	if code := m.Header.Get(contract.HeaderStatus); code != "200" {
		b.t.Fatalf("cancel-all %s: code %s: %s", target, code, m.Data)
	}
	var reply contract.CancelAllReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		b.t.Fatalf("cancel-all %s: %v: %s", target, err, m.Data)
	}
	return reply
}

// TestCancelAll: one request cancels exactly the pending messages of its
// target published before it, and answers how many. tgt.ca.a has 30
// pending messages (ids and ingress sequences); tgt.ca.b (another target)
// and tgt.ca.ab (a target of which tgt.ca.a is not a prefix, only its
// text) have theirs. Once the request's cut is fixed, 3 more of tgt.ca.a
// are published and placed (the cancelAllCut hook): they are published
// after the request and are not cancelled. The answer is cancelled 30;
// a marker published after the answer, in the same level and so
// delivered after every earlier message of it, is waited for: none of the
// 30 was delivered, every other message was.
func TestCancelAll(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	level := nats.Header{contract.HeaderLevel: {"2"}}
	withID := func(id string) nats.Header {
		h := nats.Header{contract.HeaderLevel: {"2"}}
		if id != "" {
			h.Set(contract.HeaderNatsMsgID, id)
		}
		return h
	}
	var cuts atomic.Int32
	b.startConfig("A", Config{Levels: levels.MustParse(cancelAllLevels), LeaseTTL: ownerTTL}, func(s *Service) {
		s.hooks.cancelAllCut = func(uint64) {
			if cuts.Add(1) > 1 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range 3 {
				m := &nats.Msg{Subject: "delay.tgt.ca.a", Data: fmt.Appendf(nil, "late %d", i), Header: withID(fmt.Sprintf("late-%d", i))}
				if _, err := b.js.PublishMsg(ctx, m); err != nil {
					t.Errorf("publish late %d: %v", i, err)
				}
			}
			// Placed in the level stream before the walk reads it.
			for {
				info, err := b.js.Stream(ctx, IngressStream)
				if err == nil && info.CachedInfo().State.Msgs == 0 {
					return
				}
				if ctx.Err() != nil {
					t.Errorf("late messages not routed: %v", err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	var others []string
	for i := range 30 {
		id := fmt.Sprintf("a-%d", i)
		if i%3 == 0 {
			id = "" // cancelled by its ingress sequence's placement
		}
		b.publishTo("tgt.ca.a", fmt.Sprintf("a %d", i), withID(id))
		if i%5 == 0 {
			p := fmt.Sprintf("b %d", i)
			b.publishTo("tgt.ca.b", p, withID(""))
			q := fmt.Sprintf("ab %d", i)
			b.publishTo("tgt.ca.ab", q, withID(q))
			others = append(others, p, q)
		}
	}
	b.waitRouted()
	if got := len(b.listAll("tgt.ca.a", 1000)); got != 30 {
		t.Fatalf("tgt.ca.a lists %d pending before the request, want 30", got)
	}
	reply := b.cancelAll("tgt.ca.a")
	if want := (contract.CancelAllReply{Cancelled: 30, Complete: true}); reply != want || cuts.Load() != 1 {
		t.Errorf("cancel-all tgt.ca.a: %+v (cuts %d), want %+v", reply, cuts.Load(), want)
	}
	if got := ids(b.listAll("tgt.ca.a", 1000)); !slices.Equal(got, []string{"late-0", "late-1", "late-2"}) {
		t.Errorf("tgt.ca.a lists %q after the request, want the 3 published after it", got)
	}
	b.publishTo("tgt.ca.b", "marker", level)
	got := b.waitPayload("marker", time.Minute)
	for _, p := range got {
		if strings.HasPrefix(p, "a ") {
			t.Errorf("cancelled message %q delivered", p)
		}
	}
	for _, p := range append(others, "late 0", "late 1", "late 2") {
		if !slices.Contains(got, p) {
			t.Errorf("%q not delivered before the marker; TGT holds %q", p, got)
		}
	}
	// Nothing left to cancel; a bad payload is refused.
	if reply := b.cancelAll("tgt.ca.a"); reply != (contract.CancelAllReply{Complete: true}) {
		t.Errorf("cancel-all after every message left: %+v, want 0 and complete", reply)
	}
	for _, bad := range []string{`{"x":1}`, `[`} {
		m, err := b.nc.Request(contract.CancelAllSubjectFor("tgt.ca.a"), []byte(bad), 30*time.Second)
		if err != nil || m.Header.Get(contract.HeaderStatus) != "400" || !strings.HasPrefix(string(m.Data), contract.CancelReplyErrorPrefix) {
			t.Errorf("cancel-all with payload %s: %v %v, want a 400 error answer", bad, m, err)
		}
	}
	// A target under the ingress prefix is refused, as a publish to it is.
	m, err := b.nc.Request(contract.CancelAllSubjectFor(contract.PrefixDefault+".x"), nil, 30*time.Second)
	if err != nil || m.Header.Get(contract.HeaderStatus) != "400" || !strings.Contains(string(m.Data), "prefix") {
		t.Errorf("cancel-all of a target under the ingress prefix: %v %v, want a 400 error answer naming the prefix", m, err)
	}
}

// TestCancelAllDecidedByOwner: a cancel-all taken by a replica that owns
// no level has each message decided by the levels' owner on the other
// replica (decide op "cancel"): the owner sees them cancelled (its list
// is empty), the other target's message stays.
func TestCancelAllDecidedByOwner(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	_, c := b.splitOwners(listLevels)
	for _, id := range []string{"r1", "r2", "r3"} {
		b.publishTo("tgt.r", "payload "+id, nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {id}})
	}
	b.publishTo("tgt.s", "payload s", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"s1"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reader, err := jswire.NewBatchReader(c.nc, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	reply, err := c.svc.parts.cancelAPI.CancelAll(ctx, reader, "tgt.r", nil, time.Now().Add(time.Minute))
	if want := (contract.CancelAllReply{Cancelled: 3, Complete: true}); err != nil || reply != want {
		t.Fatalf("cancel-all tgt.r through B: %+v %v, want %+v", reply, err, want)
	}
	if got := ids(b.list("tgt.r", contract.PendingRequest{}).Items); len(got) != 0 {
		t.Errorf("tgt.r lists %q after the cancel-all", got)
	}
	if got := ids(b.list("tgt.s", contract.PendingRequest{}).Items); !slices.Equal(got, []string{"s1"}) {
		t.Errorf("tgt.s lists %q, want s1", got)
	}
	m, err := b.nc.Request(contract.CancelSubjectFor("tgt.r"), []byte("r2"), 30*time.Second)
	if err != nil || string(m.Data) != contract.CancelReplyCancelled {
		t.Errorf("cancel of r2 after the cancel-all: %v %v, want cancelled", m, err)
	}
}

// TestCancelAllGuideForm sends the `nats req` form of docs/guide.md's
// "Cancel everything pending for a target" section, as written there: it
// cancels the one message pending for orders.remind and answers so.
func TestCancelAllGuideForm(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Cancel everything pending for a target\n")
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
	if len(forms) != 1 {
		t.Fatalf("docs/guide.md#cancel-everything-pending-for-a-target: %d nats req forms, want 1", len(forms))
	}
	b := setupOwners(t)
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	b.publishTo("orders.remind", "meeting", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {"remind-42"}})
	m, err := b.nc.Request(forms[0][0], []byte(forms[0][1]), time.Minute)
	if err != nil {
		t.Fatalf("nats req %s '%s': %v", forms[0][0], forms[0][1], err)
	}
	var r contract.CancelAllReply
	if code := m.Header.Get(contract.HeaderStatus); code != "200" || json.Unmarshal(m.Data, &r) != nil || r != (contract.CancelAllReply{Cancelled: 1, Complete: true}) {
		t.Errorf("nats req %s '%s': code %s, %s", forms[0][0], forms[0][1], code, m.Data)
	}
}
