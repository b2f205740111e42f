package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
)

// targetIndexRefresh is how often the index re-lists streams even without an
// advisory (advisories are core messages and can be missed on a reconnect).
const targetIndexRefresh = 30 * time.Second

// targetIndexMaxCache bounds the per-subject answer cache. Targets often carry
// ids ("orders.123.close"), so the cache is reset rather than grown past it.
const targetIndexMaxCache = 1 << 16

// Bindings (the target index) answers "is this target subject bound to a
// stream?" without a round trip per message. It keeps the subject filters of
// every stream in the account, refreshed on JetStream stream advisories and
// every 30 s, and caches answers per subject.
//
// A stream-bound target is published with a JetStream publish and confirmed
// by its PubAck; any other target is a core subject, confirmed by a flush.
// The index can be briefly stale after a stream is created or deleted: a
// stream created a moment ago still stores the core publish (JetStream
// captures core publishes), only the confirmation is a flush instead of a
// PubAck; a stream deleted a moment ago answers "no responders", which the
// scanner treats as a core subject with no interest.
//
// Its methods run on the Service's goroutine (the first Refresh), its own
// component's (Run), every level owner's loop (Bound, Forget, Refused,
// NoteError, and a Refresh forced by a publish that contradicts the index)
// and the connection's error handler (NoteError): shared by design, one
// index for the account (docs/reshape.md, R4 goroutines). Its own fields are
// never written after New; what changes lives in two lock-guarded values,
// [subjectAnswers] and [refusals], and nothing else.
type Bindings struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	logger *slog.Logger

	answers subjectAnswers // the streams' subject filters and the answers cached from them
	denied  refusals       // the server's recent publish refusals

	kick chan struct{}
}

// subjectAnswers is a lock-guarded value: the subject filters of every
// stream and the per-subject answers cached from them.
type subjectAnswers struct {
	mu       sync.RWMutex
	patterns []string
	cache    map[string]bool
	windows  dupWindows          // stream targets with a short duplicate window (dupwindow.go)
	byStream map[string][]string // each target stream's subject filters at the last refresh (unlisted.go)
}

// bound is [Bindings.Bound].
func (a *subjectAnswers) bound(subject string, logger *slog.Logger) bool {
	a.mu.RLock()
	b, ok := a.cache[subject]
	a.mu.RUnlock()
	if ok {
		return b
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b = false
	for _, p := range a.patterns {
		if contract.MatchSubject(p, subject) {
			b = true
			a.windows.matched(p, subject, logger)
			break
		}
	}
	if len(a.cache) >= targetIndexMaxCache {
		clear(a.cache)
	}
	a.cache[subject] = b
	return b
}

// forget drops the cached answer for subject.
func (a *subjectAnswers) forget(subject string) { a.mu.Lock(); delete(a.cache, subject); a.mu.Unlock() }

// set replaces the filters, each stream's filters and the short
// duplicate windows, and drops every cached answer.
func (a *subjectAnswers) set(patterns []string, byStream map[string][]string, short map[string]streamWindow) {
	a.mu.Lock()
	a.patterns = patterns
	a.byStream = byStream
	a.windows.short = short
	clear(a.cache)
	a.mu.Unlock()
}

// streams returns each target stream's subject filters at the last
// refresh (not to be modified).
func (a *subjectAnswers) streams() map[string][]string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.byStream
}

// refusals is a lock-guarded value: when the server last refused a
// publish to each subject.
type refusals struct {
	mu sync.RWMutex
	at map[string]time.Time // subject -> when the server last refused a publish to it
}

func (r *refusals) note(subject string) {
	r.mu.Lock()
	if len(r.at) >= targetIndexMaxCache {
		clear(r.at)
	}
	r.at[subject] = time.Now()
	r.mu.Unlock()
}

func (r *refusals) since(subject string) (time.Time, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	at, ok := r.at[subject]
	return at, ok
}

// New returns an empty index; call [Bindings.Refresh] once, then
// [Bindings.Run]. A nil logger discards.
func New(nc *nats.Conn, js jetstream.JetStream, logger *slog.Logger) *Bindings {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Bindings{js: js, nc: nc, logger: logger, answers: subjectAnswers{cache: make(map[string]bool)},
		denied: refusals{at: make(map[string]time.Time)}, kick: make(chan struct{}, 1)}
}

// Bound reports whether subject is captured by a stream.
func (t *Bindings) Bound(subject string) bool { return t.answers.bound(subject, t.logger) }

// Forget drops the cached answer for subject and asks for a refresh: used
// when a publish's outcome contradicts the index.
func (t *Bindings) Forget(subject string) {
	t.answers.forget(subject)
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// Refresh re-lists the account's streams.
func (t *Bindings) Refresh(ctx context.Context) error {
	var patterns []string
	short := map[string]streamWindow{}
	listed := map[string][]string{}
	lister := t.js.ListStreams(ctx)
	for info := range lister.Info() {
		if strings.HasPrefix(info.Config.Name, "DELAYD_") {
			continue // delayd's own streams never hold targets
		}
		patterns = append(patterns, info.Config.Subjects...)
		listed[info.Config.Name] = info.Config.Subjects
		noteWindow(short, info.Config)
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	kept, err := t.keepUnlisted(ctx, listed)
	if err != nil {
		return err
	}
	t.answers.set(append(patterns, kept...), listed, short)
	return nil
}

// Run keeps the index fresh until ctx is done: it refreshes on JetStream
// stream advisories and every 30 s. It returns nil when ctx is done.
func (t *Bindings) Run(ctx context.Context) error {
	sub, err := t.nc.Subscribe("$JS.EVENT.ADVISORY.STREAM.*.*", func(m *nats.Msg) {
		action := strings.TrimPrefix(m.Subject, "$JS.EVENT.ADVISORY.STREAM.")
		if strings.HasPrefix(action, "CREATED.") || strings.HasPrefix(action, "DELETED.") || strings.HasPrefix(action, "UPDATED.") {
			select {
			case t.kick <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe stream advisories: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	tick := time.NewTicker(targetIndexRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-t.kick:
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := t.Refresh(rctx); err != nil && ctx.Err() == nil {
			t.logger.Warn("target index refresh failed", slog.Any("error", err))
		}
		cancel()
	}
}

// deniedFor is how long a server's permission refusal is remembered.
const deniedFor = time.Minute

// permissionRe extracts the subject of a publish permissions violation.
var permissionRe = regexp.MustCompile(`(?i)permissions violation for publish to "([^"]+)"`)

// NoteError records a publish permissions violation reported by the server
// (as a connection's async error or LastError). It returns the refused
// subject, or "" if err is not such a violation.
func (t *Bindings) NoteError(err error) string {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return ""
	}
	m := permissionRe.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	t.denied.note(m[1])
	return m[1]
}

// Refused reports whether the server refused a publish to subject within
// the last minute.
func (t *Bindings) Refused(subject string) bool {
	at, ok := t.denied.since(subject)
	return ok && time.Since(at) < deniedFor
}
