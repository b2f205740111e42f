package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/levels"
)

// TestAnyDelayWithoutPrecision runs delayd without precision levels (DELAYD_PRECISION=off): no precision stream is
// created, and Delay-Duration and Delay-Deliver-At messages, sub-second and cascading, are each delivered once and
// never early. A last stretch shorter than the shortest level waits in that level (not in level 0), so it is at the
// target before a Delay-Level 1 message published after it (late by less than the shortest level, as docs say); each
// cascade starts in the longest level not longer than its delay.
func TestAnyDelayWithoutPrecision(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.CreateStream("NOPREC", "noprec.>")
	table := levels.MustParse("1s 5s").WithoutPrecision()
	b.StartDelayd("1s 5s", func(c *deliver.Config) { c.Levels = table })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var names []string
	list := b.JS.StreamNames(ctx)
	for name := range list.Name() {
		names = append(names, name)
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if d, ok := levels.ParseStreamName(name); ok && d > 0 && d < time.Second {
			t.Errorf("precision level stream %s created with precision off (streams: %s)", name, strings.Join(names, " "))
		}
	}
	for _, want := range []string{"DELAYD_0S", "DELAYD_1S", "DELAYD_5S"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("level stream %s missing (streams: %s)", want, strings.Join(names, " "))
		}
	}

	// The level each message is first written to, by its payload: a core
	// subscriber sees every write to a level stream.
	var mu sync.Mutex
	first := map[string]string{}
	sub, err := b.NC.Subscribe(contract.LevelSubjectPrefix+">", func(m *nats.Msg) {
		level, _, _ := strings.Cut(strings.TrimPrefix(m.Subject, contract.LevelSubjectPrefix), ".")
		mu.Lock()
		defer mu.Unlock()
		if _, ok := first[string(m.Data)]; !ok {
			first[string(m.Data)] = level
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}

	rec := itest.NewRecorder(t)
	type pair struct{ any, after string }
	var pairs []pair
	publish := func(key string, hdr nats.Header) {
		hdr.Set(contract.HeaderNatsMsgID, key)
		b.Publish("delay.noprec.x", []byte(key), hdr)
		rec.ExpectKeys(key)
	}
	for i, d := range []time.Duration{time.Millisecond, 300 * time.Millisecond, 999 * time.Millisecond, 1500 * time.Millisecond, 2700 * time.Millisecond, 6300 * time.Millisecond} {
		key := "dur-" + d.String()
		publish(key, nats.Header{contract.HeaderDuration: {d.String()}})
		if d < time.Second {
			after := "level1-" + string(rune('a'+i))
			publish(after, itest.Level(1))
			pairs = append(pairs, pair{key, after})
		}
	}
	publish("at-400ms", nats.Header{contract.HeaderDeliverAt: {contract.FormatTime(time.Now().Add(400 * time.Millisecond))}})
	publish("level1-after-at", itest.Level(1))
	pairs = append(pairs, pair{"at-400ms", "level1-after-at"})

	n := uint64(3 + 2*len(pairs)) // three durations of a second or more, and the pairs
	itest.WaitFor(t, 30*time.Second, "every message delivered", func() bool { return b.StreamCount("NOPREC") >= n })
	itest.WaitQuiet(t, 300*time.Millisecond, 10*time.Second, func() int { return int(b.StreamCount("NOPREC")) })
	msgs := b.StreamMsgs("NOPREC")
	rec.AddStream(msgs)
	rec.CheckAll()
	seq := map[string]uint64{}
	for _, m := range msgs {
		seq[string(m.Data)] = m.Sequence
	}
	for _, p := range pairs {
		if seq[p.any] > seq[p.after] {
			t.Errorf("%s delivered after %s, a Delay-Level 1 message published after it: held past the shortest level", p.any, p.after)
		}
	}

	// Each Delay-Duration message's first level is the longest level not
	// longer than its delay, and a delay shorter than the shortest level
	// (1 ms or more) waits in the shortest level, not in level 0
	// (levels.Table.WithoutPrecision). The remaining delay is counted from
	// the ingress store time, so this does not depend on load.
	mu.Lock()
	for key, want := range map[string]string{
		"dur-1ms": "1S", "dur-300ms": "1S", "dur-999ms": "1S",
		"dur-1.5s": "1S", "dur-2.7s": "1S", "dur-6.3s": "5S",
	} {
		if got := first[key]; got != want {
			t.Errorf("%s first written to level %q, want %q (DELAYD_%s)", key, got, want, want)
		}
	}
	mu.Unlock()
	// Liveness, not speed: nothing is held far past its due time plus the
	// shortest level's delay (a generous slack for a loaded machine).
	const slack = 10 * time.Second
	for _, d := range rec.Snapshot() {
		if late := d.At.Sub(d.Due); !d.Due.IsZero() && late > time.Second+slack {
			t.Errorf("%s delivered %s after its due time: more than the shortest level (1s) + %s", d.Key, late, slack)
		}
	}
}
