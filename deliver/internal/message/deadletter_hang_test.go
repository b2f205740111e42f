package message

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/internal/natstest"
)

// answerLostJS is a JetStream whose first PublishMsg sends its message
// without a reply subject (the server stores it, nobody answers) and then
// waits until its context ends: a dead letter stored by a leader that hung
// before it answered.
type answerLostJS struct {
	jetstream.JetStream
	calls atomic.Int64
}

func (j *answerLostJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if j.calls.Add(1) > 1 {
		return j.JetStream.PublishMsg(ctx, m, opts...)
	}
	if err := j.Conn().PublishMsg(m); err != nil {
		return nil, err
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestPublishDeadLetterAnswerLost: the first copy of a dead letter is
// stored and its PubAck lost. PublishDeadLetter must send it again after a
// short attempt (jswire.WriteAttempt), not wait out its 10 s bound and
// fail, and DELAYD_DLQ must hold it once (the copies share its
// Nats-Msg-Id).
func TestPublishDeadLetterAnswerLost(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: DLQStream, Subjects: []string{contract.DLQSubjectPrefix + ">"}, Duplicates: contract.DuplicateWindow,
	}); err != nil {
		t.Fatal(err)
	}
	lossy := &answerLostJS{JetStream: js}
	dl := DeadLetterMsg("tgt.x", nil, []byte("p"), errors.New("undeliverable"), "delayd-1-7")
	if err := PublishDeadLetter(ctx, lossy, dl); err != nil {
		t.Fatalf("dead letter whose first answer was lost: %v, want it stored (sent again after a short attempt)", err)
	}
	if n := lossy.calls.Load(); n < 2 {
		t.Fatalf("%d copies sent, want the first lost and a second: this run does not test a lost answer", n)
	}
	s, err := js.Stream(ctx, DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 1 {
		t.Errorf("%s holds %d messages, want the dead letter once", DLQStream, got)
	}
}
