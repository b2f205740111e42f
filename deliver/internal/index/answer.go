package index

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// The answer store: the final answer ("already delivered" or "cancelled")
// of each message whose index records were trimmed, kept for a configured
// time (DELAYD_ANSWER_KEEP) after that, so cancel and status still answer
// truly long after the index forgot the message (docs/guide.md#kept-answers).
//
// It is a stream of its own, [AnswerStream], one subject per id
// ([AnswerSubject]) holding only that id's latest answer: a lookup is one
// direct get of the subject's last message, whatever the store holds (the
// id index's slots are read whole, so it cannot keep hours). Its cost is
// the server's per-subject state, in memory, for every answer kept, plus
// the message on disk; its bounds are the stream's MaxAge (the keep) and
// MaxBytes (discarding the oldest answers first). Pending messages have no
// record there, so no bound ever drops one of theirs: those stay in
// [Stream], trimmed as before.
const (
	// AnswerStream holds the kept answers: "DELAYD_ANSWERS".
	AnswerStream = "DELAYD_ANSWERS"

	answerSubjectPrefix = contract.InternalPrefix + ".ans."
)

// AnswerSubject is the subject of key's answer: "delayd.ans." and the
// first 16 bytes of key's SHA-256, base64url without padding (22
// characters). The stored answer carries the key, which a lookup checks.
func AnswerSubject(key string) string {
	sum := sha256.Sum256([]byte(key))
	return answerSubjectPrefix + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// Answer is a message's final answer, in the wire form of a [Record]
// without a stream: Gone for "cancelled", otherwise "already delivered".
type Answer struct {
	Key       string
	Target    string    // the message's target, for a scoped request
	Cancelled bool      // else delivered
	Due       time.Time // the message's final due time
}

// Msg is the answer's message, on its key's [AnswerSubject].
func (a Answer) Msg() *nats.Msg {
	rec := Record{Key: a.Key, Gone: a.Cancelled, Due: a.Due, Target: a.Target}
	return &nats.Msg{Subject: AnswerSubject(a.Key), Data: rec.AppendTo(nil)}
}

// AnswerOf returns the final answer rec gives, the latest record of its
// key among those trimmed: ok is false for a merge key, for a placement
// that hops on (a later record places the message) and for a message
// that left delayd otherwise (a dead letter: "not found", as before).
// Only a record of a message that left its level may be passed: a
// placement then means it was handed to its target.
func AnswerOf(rec Record) (a Answer, ok bool) {
	switch {
	case rec.Key == "" || IsMergeKey(rec.Key) || rec.Hop:
		return Answer{}, false
	case rec.Gone:
		return Answer{Key: rec.Key, Target: rec.Target, Cancelled: true, Due: rec.Due}, true
	case rec.Stream == "":
		return Answer{}, false
	}
	return Answer{Key: rec.Key, Target: rec.Target, Due: rec.Due}, true
}

// AnswerConfig is [AnswerStream]'s configuration.
type AnswerConfig struct {
	// Keep is how long an answer is kept after it was written (the
	// stream's MaxAge). Required.
	Keep time.Duration
	// MaxBytes bounds the stream; past it the oldest answers go first.
	// Required.
	MaxBytes int64
	// Replicas of the stream. Required.
	Replicas int
}

// EnsureAnswerStream creates or updates [AnswerStream]: file storage,
// limits retention with the oldest discarded, one message per subject,
// direct gets allowed.
func EnsureAnswerStream(ctx context.Context, js jetstream.JetStream, cfg AnswerConfig) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              AnswerStream,
		Description:       "delayd kept answers: delivered or cancelled, by id, for cancel and status",
		Subjects:          []string{answerSubjectPrefix + ">"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            cfg.Keep,
		MaxBytes:          cfg.MaxBytes,
		MaxMsgsPerSubject: 1,
		Storage:           jetstream.FileStorage,
		Replicas:          cfg.Replicas,
		AllowDirect:       true,
		Duplicates:        100 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", AnswerStream, err)
	}
	return nil
}

// LookupAnswer returns key's kept answer: ok is false when none is kept
// (never written, past its keep, discarded by the byte bound). One direct
// get of the subject's last message, which any replica may answer.
func LookupAnswer(ctx context.Context, nc *nats.Conn, key string) (a Answer, ok bool, err error) {
	req, _ := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{AnswerSubject(key)})
	resp, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+AnswerStream, req)
	if err != nil {
		return Answer{}, false, fmt.Errorf("answer lookup: %w", err)
	}
	if resp.Header.Get(jswire.HeaderSequence) == "" {
		if resp.Header.Get("Status") == "404" {
			return Answer{}, false, nil
		}
		return Answer{}, false, fmt.Errorf("answer lookup: status %q %s", resp.Header.Get("Status"), resp.Header.Get("Description"))
	}
	DecodeRecords(resp.Data, func(r Record) {
		if r.Key == key { // not a hash collision
			a, ok = Answer{Key: r.Key, Target: r.Target, Cancelled: r.Gone, Due: r.Due}, true
		}
	})
	return a, ok, nil
}
