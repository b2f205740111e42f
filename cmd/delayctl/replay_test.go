package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
)

// TestReplayKeepsLetterOnDuplicate: a dead letter that carried its
// publisher's Nats-Msg-Id is replayed under that id once it is older than
// the ingress duplicate window. If a new message re-used the id within the
// window meanwhile, ingress drops the replay as its duplicate and stores
// nothing: replay must keep the letter and count it failed (exit 1),
// saying why, not delete it as replayed. Against a real nats-server with
// the two streams as delayd creates them, but a short ingress duplicate
// window, and no delayd (ingress keeps what it stores).
//
// The scenario says something only if replay ended within the window after
// the id was re-used: later, the window may have let the id go, and a
// stored replay is right. A loaded machine can make it slower than that, so
// the scenario runs again on a fresh server with a window twice as long
// (5 s, 10 s, 20 s, 40 s) until one run ends within its window.
func TestReplayKeepsLetterOnDuplicate(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 6 s or more for the letter to age past a 5 s ingress duplicate window")
	}
	t.Parallel()
	for window := 5 * time.Second; ; window *= 2 {
		if replayOnDuplicate(t, window) {
			return
		}
		if window >= 40*time.Second {
			t.Fatalf("replay never ended within the ingress duplicate window after the id was re-used, even a %s one", window)
		}
	}
}

// replayOnDuplicate runs the scenario of TestReplayKeepsLetterOnDuplicate
// with an ingress duplicate window of window on a server of its own and
// checks its outcome. It returns false, checking nothing, if replay ended
// after the window (the run says nothing).
func replayOnDuplicate(t *testing.T, window time.Duration) bool {
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*window+time.Minute)
	defer cancel()
	ingress, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deliver.IngressStream, Subjects: []string{"delay.>"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: window})
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deliver.DLQStream, Subjects: []string{contract.DLQSubjectPrefix + ">"}})
	if err != nil {
		t.Fatal(err)
	}
	letter := &nats.Msg{Subject: contract.DLQSubjectPrefix + "target", Data: []byte("old"), Header: nats.Header{
		contract.HeaderSubject: {"delay.orders.x"}, contract.HeaderError: {"target denied by policy"},
		contract.HeaderMsgID: {"order-1"}, contract.HeaderLevel: {"1"},
	}}
	ack, err := js.PublishMsg(ctx, letter)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := dlq.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	// replay takes a letter with a publisher id once it is older than the
	// window and a second (by the server's clock, which this one shares).
	time.Sleep(time.Until(stored.Time.Add(window + 1100*time.Millisecond)))

	// A new message re-uses the id, and replay runs within the window.
	reuse := &nats.Msg{Subject: "delay.orders.x", Data: []byte("new"), Header: nats.Header{contract.HeaderLevel: {"1"}}}
	if _, err := js.PublishMsg(ctx, reuse, jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	reused := time.Now()
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"-s", srv.ClientURL(), "--prefix", "delay", "dlq", "replay", "--id", "1"}, strings.NewReader(""), &out, &errOut)
	if took := time.Since(reused); took >= window {
		t.Logf("replay ended %s after the id was re-used, past the %s window (a loaded machine): running again with a longer one", took, window)
		return false
	}
	if code != exitError || !strings.Contains(out.String(), "1: failed") || !strings.Contains(out.String(), "nothing stored") ||
		!strings.Contains(out.String(), `"order-1"`) || !strings.Contains(out.String(), "replayed 0, not found 0, skipped 0, failed 1") {
		t.Errorf("replay: exit %d, stdout %q, stderr %q; want exit %d, the letter failed: nothing stored", code, out.String(), errOut.String(), exitError)
	}
	if _, err := dlq.GetMsg(ctx, ack.Sequence); err != nil {
		t.Errorf("the letter is gone from %s (%v), though ingress stored nothing for it", deliver.DLQStream, err)
	}
	if info, err := ingress.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("ingress: %+v, %v; want only the message that re-used the id", info, err)
	}
	return true
}
