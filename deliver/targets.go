package deliver

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/target"
)

// TargetIndex answers "is this target subject bound to a stream?" without a
// round trip per message. It keeps the subject filters of every stream in the
// account, refreshed on JetStream stream advisories and every 30 s, and
// caches answers per subject.
//
// A stream-bound target is published with a JetStream publish and confirmed
// by its PubAck; any other target is a core subject, confirmed by a flush.
// The index can be briefly stale after a stream is created or deleted: a
// stream created a moment ago still stores the core publish (JetStream
// captures core publishes), only the confirmation is a flush instead of a
// PubAck; a stream deleted a moment ago answers "no responders", which the
// scanner treats as a core subject with no interest.
//
// It wraps deliver/internal/target's Bindings, which holds the code.
type TargetIndex struct{ b *target.Bindings }

// NewTargetIndex returns an empty index; call [TargetIndex.Refresh] once, then
// [TargetIndex.Run]. A nil logger discards.
func NewTargetIndex(nc *nats.Conn, js jetstream.JetStream, logger *slog.Logger) *TargetIndex {
	return &TargetIndex{b: target.New(nc, js, logger)}
}

// Refresh re-lists the account's streams.
func (t *TargetIndex) Refresh(ctx context.Context) error { return t.b.Refresh(ctx) }

// Run keeps the index fresh until ctx is done: it refreshes on JetStream
// stream advisories and every 30 s. It returns nil when ctx is done.
func (t *TargetIndex) Run(ctx context.Context) error { return t.b.Run(ctx) }

// NoteError records a publish permissions violation reported by the server
// (as a connection's async error or LastError). It returns the refused
// subject, or "" if err is not such a violation.
func (t *TargetIndex) NoteError(err error) string { return t.b.NoteError(err) }

func (t *TargetIndex) bound(subject string) bool   { return t.b.Bound(subject) }
func (t *TargetIndex) forget(subject string)       { t.b.Forget(subject) }
func (t *TargetIndex) refused(subject string) bool { return t.b.Refused(subject) }
