package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
)

// delayctlBinary builds cmd/delayctl once per test binary.
var delayctlBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "delayctl-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "delayctl")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/delayctl").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// ctlResult is one delayctl run.
type ctlResult struct {
	stdout, stderr string
	code           int
}

// delayctl runs the delayctl binary against url (none if ""), with no other DELAYD_* variable set.
func delayctl(t *testing.T, url string, args ...string) ctlResult {
	t.Helper()
	env := map[string]string{}
	if url != "" {
		env["DELAYD_NATS_URL"] = url
	}
	return delayctlEnv(t, env, args...)
}

// delayctlEnv runs the delayctl binary with exactly the DELAYD_* variables of env set.
func delayctlEnv(t *testing.T, env map[string]string, args ...string) ctlResult {
	t.Helper()
	bin, err := delayctlBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r := ctlResult{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("delayctl %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// want fails the test unless the run exited with code and its output contains every text.
func (r ctlResult) want(t *testing.T, code int, texts ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range texts {
		if !strings.Contains(r.stdout+r.stderr, s) {
			t.Errorf("output lacks %q\nstdout: %s\nstderr: %s", s, r.stdout, r.stderr)
		}
	}
}

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
		delayctl(t, "", "stats", "--server", dead).want(t, 3, "cannot connect to "+dead, "is delayd running?")
		delayctl(t, dead, "cancel", "orders.x", "x").want(t, 3, "cannot connect to "+dead)
	})
	t.Run("no streams", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"stats"}, {"levels"}, {"dlq", "ls"}, {"pub", "orders.x", "d", "--level", "1"}, {"watch", "--count", "1"}} {
			delayctl(t, url, args...).want(t, 4, "no delayd streams on this server (DELAYD_INGRESS missing)")
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
			r := delayctl(t, url, args...)
			if r.code != 2 {
				t.Errorf("delayctl %q: exit code %d, want 2\nstderr: %s", args, r.code, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, "delayctl: ") {
				t.Errorf("delayctl %q: stderr %q, want a delayctl: error", args, r.stderr)
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		// No delayd: nobody answers the cancel API.
		delayctl(t, url, "cancel", "orders.x", "42").want(t, 1, "no delayd answered on delayd.api.cancel.orders.x")
		delayctl(t, url, "cancel", "--any", "42").want(t, 1, "no delayd answered on delayd.api.cancel")

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
			r := delayctl(t, srv.ClientURL(), "cancel", "orders.x", id)
			r.want(t, code, answers[id])
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
	r := delayctl(t, url, append([]string{"stats", "--json"}, args...)...)
	r.want(t, 0)
	var s ctlStats
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.stdout)
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
	b := setup(t)
	b.startDelayd("100ms 2s 1h")
	stop, err := b.svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	url := b.srv.ClientURL()
	table := "--levels=100ms 2s 1h"

	fast := b.collect("ctl.fast")
	const slow = 7
	first := time.Now()
	for i := range slow {
		b.publish("delay.ctl.slow", []byte(fmt.Sprint(i)), level(3))
	}
	for i := range 3 {
		b.publish("delay.ctl.fast", []byte(fmt.Sprint(i)), level(1))
	}
	fast.wait(t, 3, 10*time.Second)
	waitFor(t, 10*time.Second, "the 1h level holds every message", func() bool { return b.levelCount("DELAYD_1H") == slow })

	var s ctlStats
	waitFor(t, 10*time.Second, "stats counts 3 deliveries at 100ms", func() bool {
		s = ctlStatsJSON(t, url, table)
		d := s.Levels[s.level(t, "DELAYD_100MS")].Delivered
		return d != nil && *d == 3
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
	if hour.BehindSeconds == nil || *hour.BehindSeconds > -3590 {
		t.Errorf("DELAYD_1H behind %s, want about -3600 s", fmtSeconds(hour.BehindSeconds))
	}
	if d := hour.Delivered; d == nil || *d != 0 {
		t.Errorf("DELAYD_1H delivered %v, want 0", d)
	}
	if l := s.Levels[s.level(t, "DELAYD_100MS")]; l.Pending != 0 || l.DueNow != 0 || l.OldestDue != nil {
		t.Errorf("DELAYD_100MS: %+v, want nothing pending", l)
	}

	// Without delayd: the stream columns remain, the counters are unknown. Messages written straight into the
	// 2s level (as the router would) are pending; the ones older than 2 s are due now.
	b.stopDelayd()
	for i := range 2 {
		b.publish("delayd.level.2S.ctl.due", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderDueAt: []string{contract.FormatTime(time.Now().Add(2 * time.Second))}})
	}
	waitFor(t, 10*time.Second, "two messages due at 2s", func() bool {
		s = ctlStatsJSON(t, url, table)
		return s.Levels[s.level(t, "DELAYD_2S")].DueNow == 2
	})
	for i := range 2 {
		b.publish("delayd.level.2S.ctl.due", []byte(fmt.Sprint(i)), nats.Header{contract.HeaderDueAt: []string{contract.FormatTime(time.Now().Add(2 * time.Second))}})
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
	delayctl(t, url, "stats", table).want(t, 0, "DELIVERED and DEAD-LETTERED unknown (?)", "DELAYD_2S")

	// A level stream not in the table is listed as a leftover; watch prints finitely when not on a terminal.
	delayctl(t, url, "levels", "--levels=100ms 1h").want(t, 0, "DELAYD_2S", "not in the table")
	r := delayctl(t, url, "watch", "--count", "2", "--interval", "50ms", table)
	r.want(t, 0, "DELAYD_1H")
	if n := strings.Count(r.stdout, "delayd stats at"); n != 2 || strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("watch --count 2 printed %d tables (ANSI: %t), want 2 plain", n, strings.Contains(r.stdout, "\x1b["))
	}
}

// TestDelayctlDLQReplay dead-letters messages through a deny policy, lifts it, and replays them twice (and once
// after a simulated crash between publish and delete): each replayed message arrives exactly once.
func TestDelayctlDLQReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startDelayd("100ms 1h", func(c *deliver.Config) { c.Targets = contract.TargetPolicy{Deny: []string{"blocked.>"}} })
	url := b.srv.ClientURL()
	ctx := context.Background()

	for i := range 4 {
		b.publish("delay.blocked.a", []byte(fmt.Sprintf("m%d", i)), nats.Header{"Delay-Level": {"1"}, "X-N": {fmt.Sprint(i)}})
	}
	b.publish("delay.blocked.a", []byte("own-id"), nats.Header{"Delay-Level": {"1"}, "Nats-Msg-Id": {"pub-1"}})
	waitFor(t, 10*time.Second, "5 dead letters", func() bool { return b.streamCount(deliver.DLQStream) == 5 })
	// An undeliverable letter as a scanner writes it: Delay-Subject is the target.
	if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: contract.DLQSubjectPrefix + deliver.ReasonUndeliverable, Data: []byte("to-b"),
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
	r := delayctl(t, url, "dlq", "ls", "--json")
	r.want(t, 0)
	if err := json.Unmarshal([]byte(r.stdout), &letters); err != nil {
		t.Fatalf("dlq ls --json: %v\n%s", err, r.stdout)
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
	delayctl(t, url, "dlq", "ls", "--limit", "2").want(t, 0, "2 shown; DELAYD_DLQ holds 6 dead letter(s)")
	delayctl(t, url, "dlq", "ls", "--reason", "undeliverable").want(t, 0, "blocked.b", "1 shown; DELAYD_DLQ holds 6 dead letter(s)")
	delayctl(t, url, "dlq", "ls", "--reason", "size").want(t, 0, "0 shown; DELAYD_DLQ holds 6 dead letter(s)")

	// The fix: delayd without the deny policy.
	b.stopDelayd()
	b.startDelayd("100ms 1h")
	a, bb := b.collect("blocked.a"), b.collect("blocked.b")

	// A replay of letter 4 that crashed after its publish, before its delete.
	dlq, err := b.js.Stream(ctx, deliver.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	created := dlq.CachedInfo().Created.UnixNano()
	b.publish("delay.blocked.a", []byte("m3"), nats.Header{"Delay-Level": {"1"}, "X-N": {"3"}, "Nats-Msg-Id": {fmt.Sprintf("delayd-replay-%d-4", created)}})

	delayctl(t, url, "dlq", "replay", "--id", "1,2,3", "--id", "4", "--id", "6").
		want(t, 0, "replayed 5, not found 0, skipped 0, failed 0", "4: replayed to delay.blocked.a", "ingress already had it", "6: replayed to delay.blocked.b")
	delayctl(t, url, "dlq", "replay", "--id", "1,2,3,4,6").
		want(t, 0, "replayed 0, not found 5", "1: not found (already replayed")
	// --all: the letter with a publisher id is too young to replay under it; it stays.
	delayctl(t, url, "dlq", "replay", "--all").
		want(t, 1, "replayed 0, not found 0, skipped 1", `"pub-1" may still be in the ingress duplicate window`)
	if n := b.streamCount(deliver.DLQStream); n != 1 {
		t.Errorf("DELAYD_DLQ holds %d letters, want 1 (pub-1's)", n)
	}

	// Sentinels behind the replays on the same levels: once they arrive, any duplicate would have too.
	b.publish("delay.blocked.a", []byte("sentinel"), level(1))
	b.publish("delay.blocked.b", []byte("sentinel"), level(0))
	got := map[string][]string{}
	for subject, c := range map[string]*collector{"blocked.a": a, "blocked.b": bb} {
		waitFor(t, 10*time.Second, "sentinel on "+subject, func() bool {
			for _, m := range c.snapshot() {
				if string(m.msg.Data) == "sentinel" {
					return true
				}
			}
			return false
		})
		for _, m := range c.snapshot() {
			got[subject] = append(got[subject], string(m.msg.Data))
			if m.msg.Header.Get(contract.HeaderError) != "" || m.msg.Header.Get(contract.HeaderSubject) != "" {
				t.Errorf("%s delivery %q keeps dead-letter headers: %v", subject, m.msg.Data, m.msg.Header)
			}
			if d := string(m.msg.Data); strings.HasPrefix(d, "m") && m.msg.Header.Get("X-N") != d[1:] {
				t.Errorf("%s delivery %q: X-N %q, want the letter's own header", subject, d, m.msg.Header.Get("X-N"))
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
	b := setup(t)
	b.startDelayd("200ms 2s")
	url := b.srv.ClientURL()
	c := b.collect("ctl.cancel.>")

	pub := delayctl(t, url, "pub", "ctl.cancel.later", "later", "--level", "2")
	pub.want(t, 0)
	id := strings.TrimSpace(pub.stdout)
	delayctl(t, url, "cancel", "ctl.cancel.soon", id).want(t, 5, "not found") // another target's scope
	delayctl(t, url, "cancel", "ctl.cancel.later", id).want(t, 0, "cancelled")
	delayctl(t, url, "cancel", "--any", id).want(t, 0, "cancelled")
	// A marker behind it in the same level: levels are FIFO, so once the
	// marker is delivered the cancelled message's due has passed, and it
	// would have been delivered first.
	b.publish("delay.ctl.cancel.marker", []byte("marker"), level(2))

	delayctl(t, url, "pub", "ctl.cancel.soon", "soon", "--level", "1", "--id", "soon-1").want(t, 0, "soon-1")
	c.wait(t, 1, 10*time.Second)
	delayctl(t, url, "cancel", "ctl.cancel.soon", "soon-1").want(t, 6, "already delivered")
	delayctl(t, url, "cancel", "ctl.cancel.later", "soon-1").want(t, 5, "not found")
	delayctl(t, url, "cancel", "ctl.cancel.soon", "no-such-id").want(t, 5, "not found")
	got := c.wait(t, 2, 15*time.Second)
	var data []string
	for _, r := range got {
		data = append(data, string(r.msg.Data))
	}
	if !slices.Equal(data, []string{"soon", "marker"}) {
		t.Errorf("delivered %q, want soon then marker (the cancelled message never)", data)
	}
}

// TestDelayctlReplayRetries replays a dead letter of a retry ladder: it has
// no delay header, so it is delivered at once (not dead-lettered again),
// without the last delivery's Delay-Hops and due times.
func TestDelayctlReplayRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startDelayd("100ms 1h")
	url := b.srv.ClientURL()
	ctx := context.Background()
	c := b.collect("rtr.x")
	b.publish("delay.rtr.x", []byte("job"), nats.Header{contract.HeaderDuration: []string{"250ms"}}) // cascades: Delay-Hops 1
	ladder := delayd.MustParseLadder("100ms")
	for attempt := 1; attempt <= 2; attempt++ {
		m := c.wait(t, attempt, 10*time.Second)[attempt-1].msg
		res, err := delayd.RetryMsg(ctx, b.js, m, ladder, fmt.Errorf("failure %d", attempt))
		if err != nil {
			t.Fatal(err)
		}
		if res.DeadLettered != (attempt == 2) {
			t.Fatalf("attempt %d: %+v", attempt, res)
		}
	}
	waitFor(t, 10*time.Second, "the retries dead letter", func() bool { return b.streamCount(deliver.DLQStream) == 1 })
	delayctl(t, url, "dlq", "replay", "--all").want(t, 0, "replayed 1, not found 0")
	got := c.wait(t, 3, 10*time.Second)[2].msg
	if got.Header.Get(contract.HeaderError) != "" || got.Header.Get(contract.HeaderHops) != "" || got.Header.Get(delayd.HeaderAttempt) != "1" {
		t.Errorf("replayed delivery headers: %v", got.Header)
	}
	if enq, due := parseTime(t, got.Header, contract.HeaderEnqueuedAt), parseTime(t, got.Header, contract.HeaderDueAt); !enq.Equal(due) {
		t.Errorf("replayed at level 0: enqueued %v, due %v", enq, due)
	}
	if n := b.streamCount(deliver.DLQStream); n != 0 {
		t.Errorf("DELAYD_DLQ holds %d letters after the replay, want 0", n)
	}
}
