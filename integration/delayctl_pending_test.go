package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestDelayctlShow: show prints a pending message's id, target, due,
// level, headers and payload (text, or base64 when not UTF-8) and exits
// 0; --json prints the list API's item with its payload; --any finds it
// without its target; another target's id is not found (5), a cancelled
// message 8, a delivered one 6.
func TestDelayctlShow(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h")
	url := b.Srv.ClientURL()
	c := b.Collect("ctl.show.>")

	itest.Delayctl(t, url, "pub", "ctl.show.x", "remind me", "--level", "3", "--id", "show-1", "-H", "Tenant: acme").Want(t, 0, "show-1")
	itest.Delayctl(t, url, "pub", "ctl.show.x", "other", "--level", "3", "--id", "show-2").Want(t, 0, "show-2")
	r := itest.Delayctl(t, url, "show", "ctl.show.x", "show-1")
	r.Want(t, 0, "id        show-1\n", "target    ctl.show.x\n", "due       ", "level     1h (DELAYD_1H sequence ", "header    Tenant: acme\n", "size      9\n", "payload   remind me\n")
	if strings.Contains(r.Stdout, "show-2") {
		t.Errorf("show show-1 printed show-2:\n%s", r.Stdout)
	}
	r = itest.Delayctl(t, url, "show", "--any", "show-2", "--json")
	r.Want(t, 0)
	var item delayd.PendingMsg
	if err := json.Unmarshal([]byte(r.Stdout), &item); err != nil || item.ID != "show-2" || item.Target != "ctl.show.x" || string(item.Data) != "other" || item.Due.IsZero() {
		t.Errorf("show --any show-2 --json: %+v %v\n%s", item, err, r.Stdout)
	}
	// Without a publisher id: listed as seq:N, shown by N or seq:N; a
	// payload that is not UTF-8 in base64.
	b.Publish("delay.ctl.show.bin", []byte{0xff, 0xfe}, itest.Level(3))
	r = itest.Delayctl(t, url, "ls", "ctl.show.bin")
	r.Want(t, 0, "1 pending")
	seqID := strings.Fields(r.Stdout)[1]
	itest.Delayctl(t, url, "show", "ctl.show.bin", seqID).Want(t, 0, "id        "+seqID+"\n", "payload   base64://4=\n")
	itest.Delayctl(t, url, "show", "ctl.show.bin", strings.TrimPrefix(seqID, "seq:")).Want(t, 0, "id        "+seqID+"\n")

	itest.Delayctl(t, url, "show", "ctl.show.y", "show-1").Want(t, 5, "not found") // another target's scope
	itest.Delayctl(t, url, "cancel", "ctl.show.x", "show-2").Want(t, 0, "cancelled")
	itest.Delayctl(t, url, "show", "ctl.show.x", "show-2").Want(t, 8, "cancelled")
	itest.Delayctl(t, url, "pub", "ctl.show.soon", "soon", "--level", "1", "--id", "show-soon").Want(t, 0, "show-soon")
	c.Wait(t, 1, 15*time.Second)
	itest.Delayctl(t, url, "show", "ctl.show.soon", "show-soon").Want(t, 6, "already delivered")
	itest.Delayctl(t, url, "show", "ctl.show.x").Want(t, 2, "TARGET and ID")
}

// TestDelayctlRescheduleRequests: reschedule's usage errors exit 2 before
// a request (no delay, two delays, a bad --at, a negative --in, a bad
// target); an unknown id, or another target's, prints "not found" and
// exits 5; a delay beyond delayd's longest is delayd's 400, exit 2; the
// message stays pending at its due.
func TestDelayctlRescheduleRequests(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h")
	url := b.Srv.ClientURL()

	itest.Delayctl(t, url, "pub", "ctl.rs.x", "later", "--level", "3", "--id", "rs-1").Want(t, 0, "rs-1")
	before := itest.Delayctl(t, url, "status", "ctl.rs.x", "rs-1")
	before.Want(t, 0, "pending  due ")
	for _, args := range [][]string{
		{"reschedule", "ctl.rs.x", "rs-1"},
		{"reschedule", "ctl.rs.x", "rs-1", "--in", "1m", "--now"},
		{"reschedule", "ctl.rs.x", "rs-1", "--at", "tomorrow"},
		{"reschedule", "ctl.rs.x", "rs-1", "--in", "-1s"},
		{"reschedule", "ctl.rs.x", "rs-1", "--level", "-1"},
		{"reschedule", "ctl.*", "rs-1", "--now"},
		{"reschedule", "--any", "ctl.rs.x", "rs-1", "--now"},
		{"reschedule", "ctl.rs.x", " ", "--now"},
	} {
		if r := itest.Delayctl(t, url, args...); r.Code != 2 {
			t.Errorf("delayctl %q: exit code %d, want 2\nstderr: %s", args, r.Code, r.Stderr)
		}
	}
	itest.Delayctl(t, url, "reschedule", "ctl.rs.x", "rs-404", "--in", "1m").Want(t, 5, "not found")
	itest.Delayctl(t, url, "reschedule", "ctl.rs.y", "rs-1", "--now").Want(t, 5, "not found") // another target's scope
	itest.Delayctl(t, url, "reschedule", "--any", "rs-404", "--level", "1").Want(t, 5, "not found")
	itest.Delayctl(t, url, "reschedule", "ctl.rs.x", "rs-1", "--in", "200h").Want(t, 2, "DELAYD_MAX_DELAY")
	itest.Delayctl(t, url, "status", "ctl.rs.x", "rs-1").Want(t, 0, before.Stdout)
}

// TestDelayctlReschedule: reschedule moves a pending message (--in, --at,
// --level, then --now) and prints "rescheduled  due T"; show then prints
// that due; the message is delivered once, at once after --now, with
// Delay-Rescheduled 4 and Delay-Due-At the last T; afterwards reschedule
// exits 6, already delivered.
func TestDelayctlReschedule(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h")
	url := b.Srv.ClientURL()
	c := b.Collect("ctl.rsd.>")

	itest.Delayctl(t, url, "pub", "ctl.rsd.x", "later", "--in", "1h", "--id", "rsd-1").Want(t, 0, "rsd-1")
	at := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
	var last string
	for _, when := range [][]string{{"--in", "50m"}, {"--at", at.Format(time.RFC3339)}, {"--level", "3"}} {
		r := itest.Delayctl(t, url, append([]string{"reschedule", "ctl.rsd.x", "rsd-1"}, when...)...)
		r.Want(t, 0, "rescheduled  due ")
		last = strings.TrimSpace(strings.TrimPrefix(r.Stdout, "rescheduled  due "))
		if when[0] == "--at" && last != at.Format("2006-01-02T15:04:05.000000000Z") {
			t.Errorf("reschedule --at %s: due %s", when[1], last)
		}
		itest.Delayctl(t, url, "show", "ctl.rsd.x", "rsd-1").Want(t, 0, "due       "+last+"\n", "payload   later\n")
	}
	r := itest.Delayctl(t, url, "reschedule", "ctl.rsd.x", "rsd-1", "--now")
	r.Want(t, 0, "rescheduled  due ")
	now := strings.TrimSpace(strings.TrimPrefix(r.Stdout, "rescheduled  due "))
	got := c.Wait(t, 1, 30*time.Second)
	if m := got[0].Msg; string(m.Data) != "later" || m.Header.Get(delayd.HeaderRescheduled) != "4" || m.Header.Get(delayd.HeaderDueAt) != now {
		t.Errorf("delivered %q %v, want later with Delay-Rescheduled 4 and Delay-Due-At %s", m.Data, m.Header, now)
	}
	itest.Delayctl(t, url, "reschedule", "ctl.rsd.x", "rsd-1", "--in", "1m").Want(t, 6, "already delivered")
	if n := len(c.Snapshot()); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}
