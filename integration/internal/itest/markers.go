package itest

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// MarkerSubjects are the subjects of the routers' epoch markers in the
// level streams, "delayd.level.<level name>.delayd.router.epoch"
// (docs/guarantees.md#epoch-markers).
const MarkerSubjects = "delayd.level.*.delayd.router.epoch"

// LevelCount returns how many messages level stream name holds, not
// counting the routers' epoch markers.
func (b *Bundle) LevelCount(name string) uint64 {
	b.T.Helper()
	ctx := context.Background()
	s, err := b.JS.Stream(ctx, name)
	if err != nil {
		b.T.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(MarkerSubjects))
	if err != nil {
		b.T.Fatal(err)
	}
	var markers uint64
	for _, n := range info.State.Subjects {
		markers += n
	}
	return info.State.Msgs - markers
}

// LevelMsgs returns the messages level stream name holds, without the
// routers' epoch markers.
func (b *Bundle) LevelMsgs(name string) []*jetstream.RawStreamMsg {
	b.T.Helper()
	var out []*jetstream.RawStreamMsg
	for _, m := range b.StreamMsgs(name) {
		if !MatchMarker(m.Subject) {
			out = append(out, m)
		}
	}
	return out
}

// MatchMarker reports whether subject is an epoch marker's.
func MatchMarker(subject string) bool {
	var tokens []string
	start := 0
	for i := 0; i <= len(subject); i++ {
		if i == len(subject) || subject[i] == '.' {
			tokens = append(tokens, subject[start:i])
			start = i + 1
		}
	}
	return len(tokens) == 6 && tokens[0] == "delayd" && tokens[1] == "level" && tokens[3] == "delayd" && tokens[4] == "router" && tokens[5] == "epoch"
}
