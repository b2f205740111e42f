package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
)

// closedPort returns a loopback URL nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "nats://" + addr
}

// TestDelayctlExitCodes checks the documented exit codes of failures that need no delayd.
func TestDelayctlExitCodes(t *testing.T) {
	t.Parallel()
	bare := natstest.Start(t, nil) // JetStream, but no delayd streams
	url := bare.ClientURL()

	t.Run("no server", func(t *testing.T) {
		t.Parallel()
		dead := closedPort(t)
		itest.Delayctl(t, "", "stats", "--server", dead).Want(t, 3, "cannot connect to "+dead, "is delayd running?")
		itest.Delayctl(t, dead, "cancel", "orders.x", "x").Want(t, 3, "cannot connect to "+dead)
	})
	t.Run("no streams", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"stats"}, {"levels"}, {"dlq", "ls"}, {"pub", "orders.x", "d", "--level", "1"}, {"watch", "--count", "1"}} {
			itest.Delayctl(t, url, args...).Want(t, 4, "no delayd streams on this server (DELAYD_INGRESS missing)")
		}
	})
	t.Run("usage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"bogus"},
			{"stats", "--nope"},
			{"stats", "extra"},
			{"pub", "orders.x", "d"}, // no delay
			{"pub", "orders.x", "d", "--level", "1", "--in", "1s"},  // two delays
			{"pub", "orders.*", "d", "--level", "1"},                // wildcard target
			{"pub", "orders.x", "d", "--at", "tomorrow"},            // bad time
			{"pub", "orders.x", "d", "--level", "1", "-H", "nokey"}, // bad header
			{"cancel"},
			{"cancel", "orders.x", " "},
			{"cancel", "a"},                 // no target
			{"cancel", "a", "b", "c"},       // too many
			{"cancel", "orders.*", "b"},     // wildcard target
			{"cancel", "--any", "a", "b"},   // --any takes the id alone
			{"cancel", "$JS.API.INFO", "b"}, // a target no message can have
			{"dlq", "replay"},
			{"dlq", "replay", "--id", "1", "--all"},
			{"dlq", "replay", "--id", "x"},
			{"dlq", "ls", "--reason", "nope"},
			{"--levels", "5s 1s", "levels"},
			{"--prefix", "delayd", "stats"},
		} {
			r := itest.Delayctl(t, url, args...)
			if r.Code != 2 {
				t.Errorf("delayctl %q: exit code %d, want 2\nstderr: %s", args, r.Code, r.Stderr)
			}
			if !strings.HasPrefix(r.Stderr, "delayctl: ") {
				t.Errorf("delayctl %q: stderr %q, want a delayctl: error", args, r.Stderr)
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		// No delayd: nobody answers the cancel API.
		itest.Delayctl(t, url, "cancel", "orders.x", "42").Want(t, 1, "no delayd answered on delayd.api.cancel.orders.x")
		itest.Delayctl(t, url, "cancel", "--any", "42").Want(t, 1, "no delayd answered on delayd.api.cancel")

		// A stand-in for delayd's cancel API (built in another branch), answering per its contract.
		srv := natstest.Start(t, nil)
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		answers := map[string]string{"pending": "cancelled", "gone": "not found", "sent": "already delivered", "odd": "oops"}
		if _, err := nc.Subscribe(contract.CancelSubjectFor("orders.x"), func(m *nats.Msg) { _ = m.Respond([]byte(answers[string(m.Data)])) }); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for id, code := range map[string]int{"pending": 0, "gone": 5, "sent": 6, "odd": 1} {
			r := itest.Delayctl(t, srv.ClientURL(), "cancel", "orders.x", id)
			r.Want(t, code, answers[id])
		}
	})
}

// ctlStats is the part of `delayctl stats --json` the tests read.
type ctlStats struct {
	Levels []struct {
		Stream        string     `json:"stream"`
		Exists        bool       `json:"exists"`
		InTable       bool       `json:"in_table"`
		Pending       uint64     `json:"pending"`
		Cancelled     *uint64    `json:"cancelled"`
		DueNow        uint64     `json:"due_now"`
		OldestDue     *time.Time `json:"oldest_due"`
		BehindSeconds *float64   `json:"behind_seconds"`
		Delivered     *uint64    `json:"delivered"`
		DeadLettered  *uint64    `json:"dead_lettered"`
	} `json:"levels"`
	Counters        *deliver.StatsReply `json:"counters"`
	CountersUnknown string              `json:"counters_unknown"`
}

func ctlStatsJSON(t *testing.T, url string, args ...string) ctlStats {
	t.Helper()
	r := itest.Delayctl(t, url, append([]string{"stats", "--json"}, args...)...)
	r.Want(t, 0)
	var s ctlStats
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.Stdout)
	}
	return s
}

func (s ctlStats) level(t *testing.T, stream string) int {
	t.Helper()
	for i, l := range s.Levels {
		if l.Stream == stream {
			return i
		}
	}
	t.Fatalf("stats has no row for %s: %+v", stream, s.Levels)
	return -1
}

// TestDelayctlStats publishes known backlogs and checks stats --json against them: pending, due now, the oldest
// due time, the process counters from the stats API, and their absence without delayd.
func TestDelayctlStats(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 2s 1h")
	stop, err := b.Svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	url := b.Srv.ClientURL()
	table := "--levels=100ms 2s 1h"

	fast := b.Collect("ctl.fast")
	const slow = 7
	first := time.Now()
	for i := range slow {
		b.Publish("delay.ctl.slow", []byte(fmt.Sprint(i)), itest.Level(3))
	}
	for i := range 3 {
		b.Publish("delay.ctl.fast", []byte(fmt.Sprint(i)), itest.Level(1))
	}
	fast.Wait(t, 3, 10*time.Second)
	itest.WaitFor(t, 10*time.Second, "the 1h level holds every message", func() bool { return b.LevelCount("DELAYD_1H") == slow })

	var s ctlStats
	// The router counts a routed message once its level write's PubAck is
	// back, which may trail the write's arrival in its level stream.
	itest.WaitFor(t, 10*time.Second, "stats counts 3 deliveries at 100ms and every message routed", func() bool {
		s = ctlStatsJSON(t, url, table)
		d := s.Levels[s.level(t, "DELAYD_100MS")].Delivered
		return d != nil && *d == 3 && s.Counters != nil && s.Counters.Routed >= slow+3
	})
	if s.Counters == nil || s.CountersUnknown != "" {
		t.Fatalf("counters = %+v (%q), want delayd's", s.Counters, s.CountersUnknown)
	}
	if s.Counters.Routed != slow+3 {
		t.Errorf("counters.routed = %d, want %d", s.Counters.Routed, slow+3)
	}
	hour := s.Levels[s.level(t, "DELAYD_1H")]
	if hour.Pending != slow || hour.DueNow != 0 {
		t.Errorf("DELAYD_1H pending %d due now %d, want %d and 0", hour.Pending, hour.DueNow, slow)
	}
	if hour.OldestDue == nil || hour.OldestDue.Before(first.Add(time.Hour-time.Second)) || hour.OldestDue.After(first.Add(time.Hour+5*time.Second)) {
		t.Errorf("DELAYD_1H oldest due %v, want about %v", hour.OldestDue, first.Add(time.Hour))
	}
	if hour.BehindSeconds == nil || *hour.BehindSeconds != 0 {
		t.Errorf("DELAYD_1H behind %s, want 0 (its head is not due)", fmtSeconds(hour.BehindSeconds))
	}
	if d := hour.Delivered; d == nil || *d != 0 {
		t.Errorf("DELAYD_1H delivered %v, want 0", d)
	}
	if l := s.Levels[s.level(t, "DELAYD_100MS")]; l.Pending != 0 || l.DueNow != 0 || l.OldestDue != nil {
		t.Errorf("DELAYD_100MS: %+v, want nothing pending", l)
	}

	// Without delayd: the stream columns remain, the counters are unknown. Messages written straight into the
	// 2s level (as the router would) are pending; the ones older than 2 s are due now.
	b.StopDelayd()
	for i := range 2 {
		b.Publish("delayd.level.2S.ctl.due", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderDueAt: []string{contract.FormatTime(time.Now().Add(2 * time.Second))}})
	}
	itest.WaitFor(t, 10*time.Second, "two messages due at 2s", func() bool {
		s = ctlStatsJSON(t, url, table)
		return s.Levels[s.level(t, "DELAYD_2S")].DueNow == 2
	})
	for i := range 2 {
		b.Publish("delayd.level.2S.ctl.due", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderDueAt: []string{contract.FormatTime(time.Now().Add(2 * time.Second))}})
	}
	s = ctlStatsJSON(t, url, table)
	two := s.Levels[s.level(t, "DELAYD_2S")]
	if two.Pending != 4 || two.DueNow != 2 {
		t.Errorf("DELAYD_2S pending %d due now %d, want 4 and 2", two.Pending, two.DueNow)
	}
	if two.BehindSeconds == nil || *two.BehindSeconds < 0 {
		t.Errorf("DELAYD_2S behind %s, want >= 0 s (its head is due)", fmtSeconds(two.BehindSeconds))
	}
	if s.Counters != nil || !strings.Contains(s.CountersUnknown, "no delayd answered") || two.Delivered != nil {
		t.Errorf("counters %+v %q, delivered %v: want unknown without delayd", s.Counters, s.CountersUnknown, two.Delivered)
	}
	itest.Delayctl(t, url, "stats", table).Want(t, 0, "DELIVERED and DEAD-LETTERED unknown (?)", "DELAYD_2S")

	// A level stream not in the table is listed as a leftover; watch prints finitely when not on a terminal.
	itest.Delayctl(t, url, "levels", "--levels=100ms 1h").Want(t, 0, "DELAYD_2S", "not in the table")
	r := itest.Delayctl(t, url, "watch", "--count", "2", "--interval", "50ms", table)
	r.Want(t, 0, "DELAYD_1H")
	if n := strings.Count(r.Stdout, "delayd stats at"); n != 2 || strings.Contains(r.Stdout, "\x1b[") {
		t.Errorf("watch --count 2 printed %d tables (ANSI: %t), want 2 plain", n, strings.Contains(r.Stdout, "\x1b["))
	}
}

// TestDelayctlStatsCascadeCancel reads stats as issue 19 item 3 found them: a cascading head's OLDEST DUE is its
// delivery due (Delay-Due-At), not the end of its wait at the level; a cancelled message is not PENDING but
// CANCELLED, and is never the level's OLDEST DUE; BEHIND of a level whose head is not due is "-", never "in …".
func TestDelayctlStatsCascadeCancel(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 1m 1h")
	stop, err := b.Svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	url := b.Srv.ClientURL()
	table := "--levels=1s 1m 1h"

	// A 30-minute Delay-Duration waits its first minute in DELAYD_1M, then hops on.
	b.Publish("delay.ctl.cascade", []byte("c"), nats.Header{contract.HeaderDuration: {"30m"}, contract.HeaderNatsMsgID: {"casc-1"}})
	// Three in the 1h level. The middle one is cancelled: the head, due in an hour, keeps the scanner from
	// passing it, so its tombstone stays past the offset.
	for i := range 3 {
		b.Publish("delay.ctl.hour", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderLevel: {"3"}, contract.HeaderNatsMsgID: {fmt.Sprintf("hour-%d", i)}})
	}
	itest.WaitFor(t, 10*time.Second, "the levels hold every message", func() bool {
		return b.LevelCount("DELAYD_1M") == 1 && b.LevelCount("DELAYD_1H") == 3
	})
	if r := b.Cancel("hour-1"); r != delayd.Cancelled {
		t.Fatalf("cancel hour-1: %q, want cancelled", r)
	}
	dueAt := func(stream string, i int) time.Time {
		msgs := b.LevelMsgs(stream)
		due, err := time.Parse(time.RFC3339Nano, msgs[i].Header.Get(contract.HeaderDueAt))
		if err != nil {
			t.Fatalf("%s message %d: %v", stream, i, err)
		}
		return due
	}
	cascadeDue, hourDue := dueAt("DELAYD_1M", 0), [3]time.Time{dueAt("DELAYD_1H", 0), dueAt("DELAYD_1H", 1), dueAt("DELAYD_1H", 2)}

	s := ctlStatsJSON(t, url, table)
	minute := s.Levels[s.level(t, "DELAYD_1M")]
	if minute.OldestDue == nil || !minute.OldestDue.Equal(cascadeDue) {
		t.Errorf("DELAYD_1M oldest due %v, want the cascading message's delivery due %v", minute.OldestDue, cascadeDue)
	}
	hour := s.Levels[s.level(t, "DELAYD_1H")]
	if hour.Pending != 2 || hour.Cancelled == nil || *hour.Cancelled != 1 {
		t.Errorf("DELAYD_1H pending %d cancelled %s, want 2 and 1", hour.Pending, fmtCount(hour.Cancelled))
	}
	if hour.OldestDue == nil || !hour.OldestDue.Equal(hourDue[0]) {
		t.Errorf("DELAYD_1H oldest due %v, want its head's %v", hour.OldestDue, hourDue[0])
	}
	for _, l := range []int{s.level(t, "DELAYD_1M"), s.level(t, "DELAYD_1H")} {
		if b := s.Levels[l].BehindSeconds; b == nil || *b != 0 {
			t.Errorf("%s behind %s, want 0 (nothing overdue)", s.Levels[l].Stream, fmtSeconds(b))
		}
	}
	// The stats API and the metrics count the same way.
	if c := b.Svc.CancelledPending()["DELAYD_1H"]; c != 1 {
		t.Errorf("CancelledPending DELAYD_1H = %d, want 1", c)
	}
	cancelledSeq := b.LevelMsgs("DELAYD_1H")[1].Sequence
	for _, l := range s.Counters.Levels {
		if l.Stream == "DELAYD_1H" && (l.Pending != 2 || l.Cancelled != 1 || !slices.Equal(l.CancelledSeqs, []uint64{cancelledSeq})) {
			t.Errorf("stats API DELAYD_1H pending %d cancelled %d %v, want 2, 1 [%d]", l.Pending, l.Cancelled, l.CancelledSeqs, cancelledSeq)
		}
	}
	r := itest.Delayctl(t, url, "stats", table)
	r.Want(t, 0, "CANCELLED")
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.Contains(line, " in ") {
			t.Errorf("stats shows a future time as BEHIND: %q", line)
		}
	}

	// The head cancelled too: the scanner passes both (the offset may or may not have moved past them yet);
	// either way one message is pending, and the oldest due is the last one's.
	if r := b.Cancel("hour-0"); r != delayd.Cancelled {
		t.Fatalf("cancel hour-0: %q, want cancelled", r)
	}
	s = ctlStatsJSON(t, url, table)
	hour = s.Levels[s.level(t, "DELAYD_1H")]
	if hour.Pending != 1 || hour.OldestDue == nil || !hour.OldestDue.Equal(hourDue[2]) {
		t.Errorf("DELAYD_1H with its head cancelled: pending %d (cancelled %s), oldest due %v, want 1 and %v",
			hour.Pending, fmtCount(hour.Cancelled), hour.OldestDue, hourDue[2])
	}
}

func fmtCount(p *uint64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// TestDelayctlDLQReplay dead-letters messages through a deny policy, lifts it, and replays them twice (and once
// after a simulated crash between publish and delete): each replayed message arrives exactly once.
func TestDelayctlDLQReplay(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1h", func(c *deliver.Config) { c.Targets = contract.TargetPolicy{Deny: []string{"blocked.>"}} })
	url := b.Srv.ClientURL()
	ctx := context.Background()

	for i := range 4 {
		b.Publish("delay.blocked.a", []byte(fmt.Sprintf("m%d", i)), nats.Header{"Delay-Level": {"1"}, "X-N": {fmt.Sprint(i)}})
	}
	b.Publish("delay.blocked.a", []byte("own-id"), nats.Header{"Delay-Level": {"1"}, "Nats-Msg-Id": {"pub-1"}})
	itest.WaitFor(t, 10*time.Second, "5 dead letters", func() bool { return b.StreamCount(deliver.DLQStream) == 5 })
	// An undeliverable letter as a scanner writes it: Delay-Subject is the target.
	if _, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: contract.DLQSubjectPrefix + deliver.ReasonUndeliverable, Data: []byte("to-b"),
		Header: nats.Header{contract.HeaderSubject: {"blocked.b"}, contract.HeaderError: {"refused"}, "Nats-Msg-Id": {"delayd-1-1"}}}); err != nil {
		t.Fatal(err)
	}

	var letters []struct {
		Seq     uint64 `json:"seq"`
		Reason  string `json:"reason"`
		Subject string `json:"subject"`
		Error   string `json:"error"`
		MsgID   string `json:"msg_id"`
		Size    int    `json:"size"`
	}
	r := itest.Delayctl(t, url, "dlq", "ls", "--json")
	r.Want(t, 0)
	if err := json.Unmarshal([]byte(r.Stdout), &letters); err != nil {
		t.Fatalf("dlq ls --json: %v\n%s", err, r.Stdout)
	}
	if len(letters) != 6 {
		t.Fatalf("dlq ls: %d letters, want 6: %+v", len(letters), letters)
	}
	for i, l := range letters[:5] {
		if l.Reason != deliver.ReasonTarget || l.Subject != "delay.blocked.a" || l.Error == "" || l.Seq != uint64(i+1) {
			t.Errorf("letter %d = %+v, want seq %d, reason target, subject delay.blocked.a and an error", i, l, i+1)
		}
	}
	if letters[4].MsgID != "pub-1" || letters[5].Reason != deliver.ReasonUndeliverable || letters[5].Subject != "blocked.b" || letters[5].Size != 4 {
		t.Errorf("letters 5, 6 = %+v, %+v", letters[4], letters[5])
	}
	itest.Delayctl(t, url, "dlq", "ls", "--limit", "2").Want(t, 0, "2 shown; DELAYD_DLQ holds 6 dead letter(s)")
	itest.Delayctl(t, url, "dlq", "ls", "--reason", "undeliverable").Want(t, 0, "blocked.b", "1 shown; DELAYD_DLQ holds 6 dead letter(s)")
	itest.Delayctl(t, url, "dlq", "ls", "--reason", "size").Want(t, 0, "0 shown; DELAYD_DLQ holds 6 dead letter(s)")

	// The fix: delayd without the deny policy.
	b.StopDelayd()
	b.StartDelayd("100ms 1h")
	a, bb := b.Collect("blocked.a"), b.Collect("blocked.b")

	// A replay of letter 4 that crashed after its publish, before its delete.
	dlq, err := b.JS.Stream(ctx, deliver.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	created := dlq.CachedInfo().Created.UnixNano()
	b.Publish("delay.blocked.a", []byte("m3"), nats.Header{"Delay-Level": {"1"}, "X-N": {"3"}, "Nats-Msg-Id": {fmt.Sprintf("delayd-replay-%d-4", created)}})

	itest.Delayctl(t, url, "dlq", "replay", "--id", "1,2,3", "--id", "4", "--id", "6").
		Want(t, 0, "replayed 5, not found 0, skipped 0, failed 0", "4: replayed to delay.blocked.a", "ingress already had it", "6: replayed to delay.blocked.b")
	itest.Delayctl(t, url, "dlq", "replay", "--id", "1,2,3,4,6").
		Want(t, 0, "replayed 0, not found 5", "1: not found (already replayed")
	// --all: the letter with a publisher id is too young to replay under it; it stays.
	itest.Delayctl(t, url, "dlq", "replay", "--all").
		Want(t, 1, "replayed 0, not found 0, skipped 1", `"pub-1" may still be in the ingress duplicate window`)
	if n := b.StreamCount(deliver.DLQStream); n != 1 {
		t.Errorf("DELAYD_DLQ holds %d letters, want 1 (pub-1's)", n)
	}

	// Sentinels behind the replays on the same levels: once they arrive, any duplicate would have too.
	b.Publish("delay.blocked.a", []byte("sentinel"), itest.Level(1))
	b.Publish("delay.blocked.b", []byte("sentinel"), itest.Level(0))
	got := map[string][]string{}
	for subject, c := range map[string]*itest.Collector{"blocked.a": a, "blocked.b": bb} {
		itest.WaitFor(t, 10*time.Second, "sentinel on "+subject, func() bool {
			for _, m := range c.Snapshot() {
				if string(m.Msg.Data) == "sentinel" {
					return true
				}
			}
			return false
		})
		for _, m := range c.Snapshot() {
			got[subject] = append(got[subject], string(m.Msg.Data))
			if m.Msg.Header.Get(contract.HeaderError) != "" || m.Msg.Header.Get(contract.HeaderSubject) != "" {
				t.Errorf("%s delivery %q keeps dead-letter headers: %v", subject, m.Msg.Data, m.Msg.Header)
			}
			if d := string(m.Msg.Data); strings.HasPrefix(d, "m") && m.Msg.Header.Get("X-N") != d[1:] {
				t.Errorf("%s delivery %q: X-N %q, want the letter's own header", subject, d, m.Msg.Header.Get("X-N"))
			}
		}
	}
	slices.Sort(got["blocked.a"]) // the crashed replay's copy of m3 was published first
	if a := strings.Join(got["blocked.a"], " "); a != "m0 m1 m2 m3 sentinel" {
		t.Errorf("blocked.a got %q, want each replay once: m0 m1 m2 m3 sentinel", a)
	}
	if b := strings.Join(got["blocked.b"], " "); b != "to-b sentinel" {
		t.Errorf("blocked.b got %q, want to-b sentinel", b)
	}
}

func fmtSeconds(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprintf("%.3f s", *p)
}

// TestDelayctlCancel runs pub and cancel against a running delayd: a
// pending message is cancelled (twice, same answer) and never delivered, a
// delivered one answers already delivered, an unknown id not found, each
// with its documented exit code.
func TestDelayctlCancel(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s")
	url := b.Srv.ClientURL()
	c := b.Collect("ctl.cancel.>")

	pub := itest.Delayctl(t, url, "pub", "ctl.cancel.later", "later", "--level", "2")
	pub.Want(t, 0)
	id := strings.TrimSpace(pub.Stdout)
	itest.Delayctl(t, url, "cancel", "ctl.cancel.soon", id).Want(t, 5, "not found") // another target's scope
	itest.Delayctl(t, url, "cancel", "ctl.cancel.later", id).Want(t, 0, "cancelled")
	itest.Delayctl(t, url, "cancel", "--any", id).Want(t, 0, "cancelled")
	// A marker behind it in the same level: levels are FIFO, so once the
	// marker is delivered the cancelled message's due has passed, and it
	// would have been delivered first.
	b.Publish("delay.ctl.cancel.marker", []byte("marker"), itest.Level(2))

	itest.Delayctl(t, url, "pub", "ctl.cancel.soon", "soon", "--level", "1", "--id", "soon-1").Want(t, 0, "soon-1")
	c.Wait(t, 1, 10*time.Second)
	itest.Delayctl(t, url, "cancel", "ctl.cancel.soon", "soon-1").Want(t, 6, "already delivered")
	itest.Delayctl(t, url, "cancel", "ctl.cancel.later", "soon-1").Want(t, 5, "not found")
	itest.Delayctl(t, url, "cancel", "ctl.cancel.soon", "no-such-id").Want(t, 5, "not found")
	got := c.Wait(t, 2, 15*time.Second)
	var data []string
	for _, r := range got {
		data = append(data, string(r.Msg.Data))
	}
	if !slices.Equal(data, []string{"soon", "marker"}) {
		t.Errorf("delivered %q, want soon then marker (the cancelled message never)", data)
	}
}

// TestDelayctlPubReusedID moves a reminder the way a new user would: pub
// with --id, cancel, pub again with the same --id and a new delay. The
// ingress stream drops the second as a duplicate (its window is 2 min):
// pub must exit 7, print no id, and say why (the id, the window, nothing
// stored); nothing is delivered. A new id works.
func TestDelayctlPubReusedID(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s")
	url := b.Srv.ClientURL()
	c := b.Collect("ctl.remind.>")

	itest.Delayctl(t, url, "pub", "ctl.remind.me", "at 10", "--in", "1h", "--id", "remind-7").Want(t, 0, "remind-7")
	itest.Delayctl(t, url, "cancel", "ctl.remind.me", "remind-7").Want(t, 0, "cancelled")
	again := itest.Delayctl(t, url, "pub", "ctl.remind.me", "at 11", "--in", "1s", "--id", "remind-7")
	again.Want(t, 7, `"remind-7"`, "2m0s", "nothing stored")
	if again.Stdout != "" {
		t.Errorf("pub of a dropped duplicate printed %q on stdout, want no id", again.Stdout)
	}
	itest.Delayctl(t, url, "pub", "ctl.remind.me", "at 11", "--in", "1s", "--id", "remind-8").Want(t, 0, "remind-8")
	// Had the dropped publish been stored, it would be due before
	// remind-8 (the same delay, published first) and delivered first.
	got := c.Wait(t, 1, 15*time.Second)
	if id := got[0].Msg.Header.Get("Nats-Msg-Id"); len(got) != 1 || string(got[0].Msg.Data) != "at 11" || !strings.Contains(id, "remind-8") {
		t.Errorf("delivered %d messages, the first %q with id %q; want remind-8's \"at 11\" alone", len(got), got[0].Msg.Data, id)
	}
}

// TestDelayctlReplayRetries replays a dead letter of a retry ladder: it has
// no delay header, so it is delivered at once (not dead-lettered again),
// without the last delivery's Delay-Hops and due times.
func TestDelayctlReplayRetries(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("100ms 1h")
	url := b.Srv.ClientURL()
	ctx := context.Background()
	c := b.Collect("rtr.x")
	b.Publish("delay.rtr.x", []byte("job"), nats.Header{contract.HeaderDuration: []string{"250ms"}}) // cascades: Delay-Hops 1
	ladder := delayd.MustParseLadder("100ms")
	for attempt := 1; attempt <= 2; attempt++ {
		m := c.Wait(t, attempt, 10*time.Second)[attempt-1].Msg
		res, err := delayd.RetryMsg(ctx, b.JS, m, ladder, fmt.Errorf("failure %d", attempt))
		if err != nil {
			t.Fatal(err)
		}
		if res.DeadLettered != (attempt == 2) {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
	}
	itest.WaitFor(t, 10*time.Second, "the retries dead letter", func() bool { return b.StreamCount(deliver.DLQStream) == 1 })
	itest.Delayctl(t, url, "dlq", "replay", "--all").Want(t, 0, "replayed 1, not found 0")
	got := c.Wait(t, 3, 10*time.Second)[2].Msg
	if got.Header.Get(contract.HeaderError) != "" || got.Header.Get(contract.HeaderHops) != "" || got.Header.Get(delayd.HeaderAttempt) != "1" {
		t.Errorf("replayed delivery headers: %v", got.Header)
	}
	if enq, due := parseTime(t, got.Header, contract.HeaderEnqueuedAt), parseTime(t, got.Header, contract.HeaderDueAt); !enq.Equal(due) {
		t.Errorf("replayed at level 0: enqueued %v, due %v", enq, due)
	}
	if n := b.StreamCount(deliver.DLQStream); n != 0 {
		t.Errorf("DELAYD_DLQ holds %d letters after the replay, want 0", n)
	}
}

// TestDelayctlStatus: delayctl status prints each state with its exit
// code (pending 0 with its due, not found 5, already delivered 6,
// cancelled 8) and changes nothing: the pending message is delivered.
func TestDelayctlStatus(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h")
	url := b.Srv.ClientURL()
	c := b.Collect("ctl.status.>")

	itest.Delayctl(t, url, "pub", "ctl.status.x", "later", "--level", "2", "--id", "st-later").Want(t, 0, "st-later")
	itest.Delayctl(t, url, "status", "ctl.status.x", "st-later").Want(t, 0, "pending  due ")
	itest.Delayctl(t, url, "status", "ctl.status.y", "st-later").Want(t, 5, "not found") // another target's scope
	itest.Delayctl(t, url, "pub", "ctl.status.x", "gone", "--level", "3", "--id", "st-gone").Want(t, 0, "st-gone")
	itest.Delayctl(t, url, "cancel", "ctl.status.x", "st-gone").Want(t, 0, "cancelled")
	itest.Delayctl(t, url, "status", "--any", "st-gone").Want(t, 8, "cancelled")
	c.Wait(t, 1, 15*time.Second)
	itest.Delayctl(t, url, "status", "ctl.status.x", "st-later").Want(t, 6, "already delivered")
	itest.Delayctl(t, url, "status", "ctl.status.x").Want(t, 2, "TARGET and ID")
}

// TestDelayctlLs: delayctl ls lists one target's pending messages in due
// order across pages (--limit 1), with the count, and none of another
// target's; a bad limit is a usage error. ls --any lists across the
// targets a subject matches.
func TestDelayctlLs(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h 2h")
	url := b.Srv.ClientURL()
	itest.Delayctl(t, url, "pub", "ctl.ls.x", "late", "--level", "4", "--id", "ls-late").Want(t, 0, "ls-late")
	itest.Delayctl(t, url, "pub", "ctl.ls.y", "other", "--level", "3", "--id", "ls-other").Want(t, 0, "ls-other")
	itest.Delayctl(t, url, "pub", "ctl.ls.x", "early", "--level", "3", "--id", "ls-early").Want(t, 0, "ls-early")
	r := itest.Delayctl(t, url, "ls", "ctl.ls.x", "--limit", "1")
	r.Want(t, 0, "2 pending")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "  ls-early  1h  5") || !strings.Contains(lines[1], "  ls-late  2h  4") {
		t.Errorf("ls ctl.ls.x: %q, want ls-early, ls-late, the count", lines)
	}
	itest.Delayctl(t, url, "ls", "ctl.ls.x", "--limit", "0").Want(t, 2, "--limit 0")
	// The operator form: every target under ctl.ls, each line with its
	// target; a target under ctl.ls.y only with that filter.
	r = itest.Delayctl(t, url, "ls", "--any", "ctl.ls.>")
	r.Want(t, 0, "3 pending, next due ")
	lines = strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "  ls-other  ctl.ls.y  1h  5") || !strings.Contains(lines[1], "  ls-early  ctl.ls.x  1h  5") || !strings.Contains(lines[2], "  ls-late  ctl.ls.x  2h  4") {
		t.Errorf("ls --any ctl.ls.>: %q, want ls-other, ls-early (published after it), ls-late with their targets, the count", lines)
	}
	itest.Delayctl(t, url, "ls", "--any", "ctl.ls.y").Want(t, 0, "1 pending")
	itest.Delayctl(t, url, "ls", "--any", "a", "b").Want(t, 2, "at most one SUBJECT")
}

// TestDelayctlCancelAll: `cancel --all TARGET` cancels the target's two pending messages and prints the count;
// the other target's message stays listed; a second run cancels none; --all with an ID, or with --any, is a
// usage error.
func TestDelayctlCancelAll(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("200ms 2s 1h 2h")
	url := b.Srv.ClientURL()
	itest.Delayctl(t, url, "pub", "ctl.ca.x", "one", "--level", "3", "--id", "ca-1").Want(t, 0, "ca-1")
	itest.Delayctl(t, url, "pub", "ctl.ca.y", "other", "--level", "3", "--id", "ca-other").Want(t, 0, "ca-other")
	itest.Delayctl(t, url, "pub", "ctl.ca.x", "two", "--level", "4").Want(t, 0)
	itest.Delayctl(t, url, "cancel", "--all", "ctl.ca.x").Want(t, 0, "cancelled 2 (already delivered 0)")
	itest.Delayctl(t, url, "ls", "ctl.ca.x").Want(t, 0, "0 pending")
	itest.Delayctl(t, url, "ls", "ctl.ca.y").Want(t, 0, "ca-other")
	itest.Delayctl(t, url, "cancel", "--all", "ctl.ca.x").Want(t, 0, "cancelled 0 (already delivered 0)")
	itest.Delayctl(t, url, "cancel", "--all", "ctl.ca.x", "ca-1").Want(t, 2, "one TARGET")
	itest.Delayctl(t, url, "cancel", "--all", "--any", "ctl.ca.x").Want(t, 2, "not both")
}

// TestDelayctlLevelsMessages: `levels` counts the messages a level stream holds without the routers' epoch markers
// (every level stream holds one from the router's start): an empty level shows 0, not 1, and a level holding one
// message shows 1, in the table and in JSON.
func TestDelayctlLevelsMessages(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.StartDelayd("1s 1h")
	url := b.Srv.ClientURL()
	table := "--levels=1s 1h"
	b.Publish("delay.ctl.levels.x", []byte("later"), itest.Level(2))
	// Routed: the router acks an ingress message once its level write is stored.
	itest.WaitFor(t, 15*time.Second, "the message routed to DELAYD_1H", func() bool {
		return b.StreamCount(deliver.IngressStream) == 0
	})

	var rows []struct {
		Stream   string `json:"stream"`
		Messages uint64 `json:"messages"`
	}
	r := itest.Delayctl(t, url, "levels", "--json", table)
	r.Want(t, 0)
	if err := json.Unmarshal([]byte(r.Stdout), &rows); err != nil {
		t.Fatalf("levels --json: %v\n%s", err, r.Stdout)
	}
	want := map[string]uint64{"DELAYD_0S": 0, "DELAYD_1S": 0, "DELAYD_1H": 1}
	for _, row := range rows {
		if w, ok := want[row.Stream]; ok {
			if row.Messages != w {
				t.Errorf("levels --json: %s messages %d, want %d (epoch markers not counted)", row.Stream, row.Messages, w)
			}
			delete(want, row.Stream)
		}
	}
	if len(want) > 0 {
		t.Errorf("levels --json lists none of %v:\n%s", want, r.Stdout)
	}
	text := itest.Delayctl(t, url, "levels", table)
	text.Want(t, 0)
	for _, line := range strings.Split(text.Stdout, "\n") {
		// LEVEL DELAY STREAM EXISTS MESSAGES
		if f := strings.Fields(line); len(f) >= 5 && f[2] == "DELAYD_1S" && f[4] != "0" {
			t.Errorf("levels: DELAYD_1S shows %s messages, want 0: %q", f[4], line)
		}
	}
}
