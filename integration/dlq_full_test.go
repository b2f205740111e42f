package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
)

// TestDeadLetterStreamRefuses fills DELAYD_DLQ (max_msgs 10, discard new)
// with 50 messages that must be dead-lettered: 25 with an invalid level (the
// router's path) and 25 that a target stream refuses for good (the scanner's
// path, after its attempts). 10 are stored; the other 40 are neither lost
// nor acked nor passed by the level's offset, readiness names DELAYD_DLQ,
// and valid messages to another level are delivered meanwhile. Once the
// limit is raised every one of the 50 is in DELAYD_DLQ exactly once and the
// ingress stream drains.
func TestDeadLetterStreamRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 30 s stall threshold: skipped when testing.Short()")
	}
	t.Parallel()
	b := itest.Setup(t)
	ctx := context.Background()
	if _, err := b.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 512, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	b.CreateStream("OK", "ok.>")
	b.StartDelayd("100ms 300ms")
	b.SetDLQLimit(10)

	const nBad, nBig = 25, 25
	big := bytes.Repeat([]byte{0xab}, 1024)
	for i := range max(nBad, nBig) {
		if i < nBad {
			b.Publish(fmt.Sprintf("delay.bad.%02d", i), []byte("bad"), nats.Header{"Delay-Level": {"x"}})
		}
		if i < nBig {
			b.Publish(fmt.Sprintf("delay.small.%02d", i), big, itest.Level(1))
		}
	}
	itest.WaitFor(t, 30*time.Second, "10 dead letters", func() bool { return b.StreamCount(deliver.DLQStream) >= 10 })

	// Readiness reports the refusing dead-letter stream once it has refused
	// for the stall threshold.
	itest.WaitFor(t, 60*time.Second, "readiness to name DELAYD_DLQ", func() bool {
		return !b.Svc.Ready() && strings.Contains(strings.Join(b.Svc.Unready(), "; "), deliver.DLQStream)
	})
	t.Logf("unready: %q", b.Svc.Unready())

	// Other levels keep flowing: valid messages to level 2 are delivered.
	const nOK = 10
	for i := range nOK {
		b.Publish(fmt.Sprintf("delay.ok.%02d", i), []byte("ok"), itest.Level(2))
	}
	itest.WaitFor(t, 20*time.Second, "valid messages delivered while DELAYD_DLQ refuses", func() bool {
		return b.StreamCount("OK") >= nOK
	})

	// 10 stored; nothing lost: every other one is still in ingress (router
	// path) or past the level's committed offset (scanner path).
	if n := b.StreamCount(deliver.DLQStream); n != 10 {
		t.Errorf("DELAYD_DLQ holds %d, want 10", n)
	}
	var inLevel uint64
	for _, st := range scannerStats(b.Svc) {
		if st.Stream == "DELAYD_100MS" {
			inLevel = st.Pending
		}
	}
	inDLQ, badIn, bigIn := b.StreamCount(deliver.DLQStream), b.IngressCount("delay.bad.>"), b.IngressCount("delay.small.>")
	if got := inDLQ + badIn + bigIn + inLevel; got != nBad+nBig {
		t.Errorf("DLQ %d + in ingress %d + %d + past the offset of DELAYD_100MS %d = %d, want %d: something was acked or passed without its dead letter",
			inDLQ, badIn, bigIn, inLevel, got, nBad+nBig)
	}
	if d := b.Svc.DLQRefusals(); d.Waiting == 0 || d.Failures == 0 {
		t.Errorf("DLQRefusals = %+v, want dead letters waiting and failures counted", d)
	}
	if n := b.IngressCount("delay.bad.>"); n == 0 {
		t.Errorf("no invalid message left in ingress, want those whose dead letter was refused")
	}

	b.SetDLQLimit(-1)
	itest.WaitFor(t, 60*time.Second, "all 50 in DELAYD_DLQ", func() bool {
		return b.StreamCount(deliver.DLQStream) >= nBad+nBig
	})
	itest.WaitFor(t, 30*time.Second, "the ingress stream to drain", func() bool {
		return b.StreamCount(deliver.IngressStream) == 0
	})
	seen := make(map[string]int)
	for _, m := range b.StreamMsgs(deliver.DLQStream) {
		seen[m.Header.Get(contract.HeaderSubject)]++
	}
	for i := range max(nBad, nBig) {
		for _, subj := range []string{fmt.Sprintf("delay.bad.%02d", i), fmt.Sprintf("small.%02d", i)} {
			if i >= nBad && strings.HasPrefix(subj, "delay.bad") || i >= nBig && strings.HasPrefix(subj, "small") {
				continue
			}
			n := seen[subj] + seen["delay."+subj]
			if strings.HasPrefix(subj, "delay.") {
				n = seen[subj]
			}
			if n != 1 {
				t.Errorf("%s dead-lettered %d times, want once", subj, n)
			}
		}
	}
	if n := b.StreamCount(deliver.DLQStream); n != nBad+nBig {
		t.Errorf("DELAYD_DLQ holds %d, want %d", n, nBad+nBig)
	}
	itest.WaitFor(t, 30*time.Second, "ready again", b.Svc.Ready)
}

func scannerStats(svc *deliver.Service) []deliver.ScannerStats {
	_, ss := svc.Stats()
	return ss
}
