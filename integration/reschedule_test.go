package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestRescheduleGuideForms sends the `nats req` forms of docs/guide.md's
// "Reschedule" section, read from the page, in order, to a running delayd
// holding remind-42 for orders.remind: each answers rescheduled (200) with
// its new due in Delay-Due-At; after the last (Delay-Duration: 0s, run now)
// the message is delivered at once, with that due and Delay-Rescheduled
// equal to the number of forms.
func TestRescheduleGuideForms(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Reschedule: move a pending message\n")
	section, _, _ = strings.Cut(section, "\n## ")
	type form struct{ header, value, subject, id string }
	var forms []form
	for line := range strings.Lines(section) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "nats req -H ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		k, v, ok := strings.Cut(f[0], ":")
		if len(f) != 3 || !ok {
			t.Fatalf("guide form %q: want nats req -H KEY:VALUE SUBJECT ID", line)
		}
		forms = append(forms, form{k, v, f[1], f[2]})
	}
	if len(forms) < 2 || forms[len(forms)-1].value != "0s" {
		t.Fatalf("docs/guide.md#reschedule-move-a-pending-message: forms %+v, want at least two, the last a run now (0s)", forms)
	}
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h")
	c := b.Collect("orders.remind")
	b.Publish("delay.orders.remind", []byte("meeting"), nats.Header{contract.HeaderDuration: {"1h"}, contract.HeaderNatsMsgID: {"remind-42"}})
	var due string
	for _, f := range forms {
		m, err := b.NC.RequestMsg(&nats.Msg{Subject: f.subject, Header: nats.Header{f.header: {f.value}}, Data: []byte(f.id)}, 30*time.Second)
		if err != nil {
			t.Fatalf("nats req -H %s:%s %s %s: %v", f.header, f.value, f.subject, f.id, err)
		}
		due = m.Header.Get(contract.HeaderDueAt)
		if code := m.Header.Get(contract.HeaderStatus); code != "200" || string(m.Data) != "rescheduled" || due == "" {
			t.Fatalf("nats req -H %s:%s %s %s: %s %q %v, want rescheduled (200) with Delay-Due-At", f.header, f.value, f.subject, f.id, code, m.Data, m.Header)
		}
	}
	got := c.Wait(t, 1, 30*time.Second)[0].Msg
	if string(got.Data) != "meeting" || got.Header.Get(contract.HeaderDueAt) != due || got.Header.Get(delayd.HeaderRescheduled) != strconv.Itoa(len(forms)) {
		t.Errorf("delivered %q %v; want meeting, Delay-Due-At %s (the run now's), Delay-Rescheduled %d", got.Data, got.Header, due, len(forms))
	}
}
