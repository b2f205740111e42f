package integration

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// markerSubjects are the subjects of the routers' epoch markers in the
// level streams, "delayd.level.<level name>.delayd.router.epoch" (README
// "Guarantees": epoch markers).
const markerSubjects = "delayd.level.*.delayd.router.epoch"

// levelCount returns how many messages level stream name holds, not
// counting the routers' epoch markers.
func (b *testBundle) levelCount(name string) uint64 {
	b.t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(markerSubjects))
	if err != nil {
		b.t.Fatal(err)
	}
	var markers uint64
	for _, n := range info.State.Subjects {
		markers += n
	}
	return info.State.Msgs - markers
}

// levelMsgs returns the messages level stream name holds, without the
// routers' epoch markers.
func (b *testBundle) levelMsgs(name string) []*jetstream.RawStreamMsg {
	b.t.Helper()
	var out []*jetstream.RawStreamMsg
	for _, m := range b.streamMsgs(name) {
		if !matchMarker(m.Subject) {
			out = append(out, m)
		}
	}
	return out
}

// matchMarker reports whether subject is an epoch marker's.
func matchMarker(subject string) bool {
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
