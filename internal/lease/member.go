package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MemberKeyPrefix prefixes a replica's membership key in the bucket:
// "member." + its holder id, e.g. "member.web-1-4242-9f2c01ab". Lease keys
// never start with it.
const MemberKeyPrefix = "member."

// MemberKey returns holder's membership key.
func MemberKey(holder string) string { return MemberKeyPrefix + holder }

// Member is a membership key's value, as JSON:
// {"v":1,"holder":"web-1-4242-9f2c01ab","settings":{"DELAYD_LEVELS":"1s 5s"}}.
type Member struct {
	// Version is the encoding's version, [ValueVersion].
	Version int `json:"v"`
	// Holder is the replica's holder id, as in its leases.
	Holder string `json:"holder"`
	// Settings are the replica's settings that every live replica must
	// share, by variable name ("DELAYD_LEVELS": "1s 5s 10s").
	Settings map[string]string `json:"settings,omitempty"`
	// Bidding is set once the replica bids for leases
	// ([Membership.Bidding]): only then does it count in the others'
	// shares.
	Bidding bool `json:"bidding,omitempty"`
}

// MismatchError is [Membership.Start]'s error when a live replica's
// setting differs from this one's. It wraps [ErrMismatch].
type MismatchError struct {
	// Setting is the variable's name, e.g. "DELAYD_LEVELS".
	Setting string
	// Ours and Theirs are the two values.
	Ours, Theirs string
	// Holder is the live replica's holder id.
	Holder string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s=%q differs from live replica %s's %q: replicas must share it (to change it, stop every replica, then start them with the new value)",
		e.Setting, e.Ours, e.Holder, e.Theirs)
}

// Unwrap returns [ErrMismatch].
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// MembershipConfig configures a [Membership].
type MembershipConfig struct {
	// Holder is this replica's id, the one its leases carry. Required.
	Holder string
	// TTL is T: a member whose key's revision is seen unchanged for TTL
	// on this process's monotonic clock is no longer live. Optional.
	// Default [TTLDefault]. The key is renewed every TTL/3.
	TTL time.Duration
	// Settings must equal every live member's, setting by setting (a
	// setting only one of the two has is not compared). Optional.
	Settings map[string]string
	// Logger is optional. Default discards.
	Logger *slog.Logger
}

// Membership announces this replica in the bucket (its membership key,
// renewed every TTL/3, deleted when it stops) and follows the others'
// keys, so that a replica can count the live ones ([Membership.Live]) and
// aim for its share of the leases. Liveness is judged as for leases: a key
// whose revision is seen unchanged for TTL on this process's monotonic
// clock belongs to a replica that stopped; no wall clock is compared.
type Membership struct {
	kv       jetstream.KeyValue
	js       jetstream.JetStream // nil: no reconcile
	key      string
	holder   string
	ttl      time.Duration
	value    []byte
	settings map[string]string
	logger   *slog.Logger

	bidding chan struct{} // closed by Bidding

	mu     sync.Mutex
	value2 []byte                // the value with Bidding set, written once bidding is closed
	others map[string]memberSeen // by key
	done   chan struct{}         // closed when the key was deleted after Start's ctx ended
}

// memberSeen is another member's key as last seen.
type memberSeen struct {
	rev    uint64
	at     time.Time // when rev was first seen
	member Member    // zero if the value does not decode
}

// NewMembership returns the membership of cfg.Holder in b, not started.
// It returns an error for a missing Holder or a negative TTL.
func NewMembership(b *Bucket, cfg MembershipConfig) (*Membership, error) {
	switch {
	case b == nil:
		return nil, errors.New("lease: a bucket is required")
	case cfg.Holder == "" || !validKey(MemberKey(cfg.Holder)):
		return nil, fmt.Errorf("lease: Holder %q: required, and only letters, digits and -_=/. allowed", cfg.Holder)
	case cfg.TTL < 0:
		return nil, fmt.Errorf("lease: TTL %s: must not be negative", cfg.TTL)
	}
	if cfg.TTL == 0 {
		cfg.TTL = TTLDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	v, _ := json.Marshal(Member{Version: ValueVersion, Holder: cfg.Holder, Settings: cfg.Settings}) // strings only: always marshals
	v2, _ := json.Marshal(Member{Version: ValueVersion, Holder: cfg.Holder, Settings: cfg.Settings, Bidding: true})
	return &Membership{kv: b.kv, js: b.js, key: MemberKey(cfg.Holder), holder: cfg.Holder, ttl: cfg.TTL, value: v, value2: v2,
		settings: maps.Clone(cfg.Settings), logger: cfg.Logger, others: map[string]memberSeen{}, done: make(chan struct{}),
		bidding: make(chan struct{})}, nil
}

// Bidding announces that this replica now bids for leases: from its next
// write on (at once), the others count it in their shares and hand it
// leases. A replica still setting up is not handed leases it would not
// take. Safe to call more than once.
func (m *Membership) Bidding() {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.bidding:
	default:
		close(m.bidding)
	}
}

// Start writes this replica's membership key and reads every other
// member's. A member whose settings differ is waited for up to TTL: if it
// renews its key meanwhile it is live, and Start deletes its own key and
// returns a [*MismatchError] (wrapping [ErrMismatch]) naming the first
// differing setting; if it does not, it stopped, and its settings do not
// count. So a changed setting is accepted once every replica with the old
// one has stopped. Start then renews the key every TTL/3 and follows the
// others' until ctx ends, then deletes the key (on a fresh context bounded
// by 5 s) and closes [Membership.Done]. Other errors are failed reads or
// writes; call Start again.
func (m *Membership) Start(ctx context.Context) error {
	wctx, stopWatch := context.WithCancel(ctx)
	ok := false
	defer func() {
		if !ok {
			stopWatch()
		}
	}()
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := m.kv.Put(jctx, m.key, m.value); err != nil {
		return fmt.Errorf("lease: announce %s: %w", m.key, err)
	}
	w, err := m.kv.Watch(wctx, MemberKeyPrefix+">")
	if err != nil {
		m.leave()
		return fmt.Errorf("lease: watch members: %w", err)
	}
	// The current values, up to the nil that ends them.
	for initial := true; initial; {
		select {
		case e, open := <-w.Updates():
			if !open {
				m.leave()
				return fmt.Errorf("lease: watch members: %w", cmpErr(jctx.Err(), errors.New("watch ended")))
			}
			if e == nil {
				initial = false
				break
			}
			m.observe(e)
		case <-jctx.Done():
			m.leave()
			return fmt.Errorf("lease: read members: %w", jctx.Err())
		}
	}
	if err := m.reconcile(jctx); err != nil {
		m.leave()
		return err
	}
	if err := m.check(jctx, w); err != nil {
		m.leave()
		return err
	}
	ok = true
	go m.run(ctx, w, stopWatch)
	return nil
}

// reconcile reads the member keys the bucket's stream holds and observes
// any that the watch's initial values did not deliver: under load a
// replica once started with another level table while a live one ran,
// whose key was missing from its initial values. One stream info request
// (the subjects under member.>) and a get per key missed.
func (m *Membership) reconcile(ctx context.Context) error {
	if m.js == nil {
		return nil
	}
	s, err := m.js.Stream(ctx, "KV_"+BucketName)
	if err != nil {
		return fmt.Errorf("lease: read members: %w", err)
	}
	prefix := "$KV." + BucketName + "."
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+MemberKeyPrefix+">"))
	if err != nil {
		return fmt.Errorf("lease: read members: %w", err)
	}
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, prefix)
		m.mu.Lock()
		_, seen := m.others[key]
		m.mu.Unlock()
		if key == m.key || seen {
			continue
		}
		e, err := m.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted (a delete marker is left on the subject), or gone meanwhile
		}
		if err != nil {
			return fmt.Errorf("lease: read member %s: %w", key, err)
		}
		m.logger.Debug("member key missing from the watch's initial values", slog.String("key", key))
		m.observe(e)
	}
	return nil
}

// check waits until no member with different settings is live: each
// such member's key must stay unchanged for TTL from when it was first
// seen. A change of its revision means it is live: a *MismatchError.
func (m *Membership) check(ctx context.Context, w jetstream.KeyWatcher) error {
	type suspect struct {
		rev uint64
		err *MismatchError
	}
	suspects := map[string]suspect{}
	m.mu.Lock()
	for k, o := range m.others {
		if err := m.differs(o.member); err != nil {
			suspects[k] = suspect{o.rev, err}
		}
	}
	m.mu.Unlock()
	if len(suspects) == 0 {
		return nil
	}
	t := time.NewTicker(m.ttl / 10)
	defer t.Stop()
	for {
		m.mu.Lock()
		for k, s := range suspects {
			o, present := m.others[k]
			switch {
			case !present:
				delete(suspects, k) // it left
			case o.rev != s.rev:
				m.mu.Unlock()
				return s.err // it renewed: live
			case time.Since(o.at) >= m.ttl:
				delete(suspects, k) // unchanged for TTL: it stopped
			}
		}
		m.mu.Unlock()
		if len(suspects) == 0 {
			return nil
		}
		select {
		case e, open := <-w.Updates():
			if !open {
				return fmt.Errorf("lease: watch members: %w", cmpErr(ctx.Err(), errors.New("watch ended")))
			}
			if e != nil {
				m.observe(e)
			}
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("lease: read members: %w", ctx.Err())
		}
	}
}

// differs returns the first setting (by name) in which o differs from
// this replica, or nil.
func (m *Membership) differs(o Member) *MismatchError {
	for _, k := range slices.Sorted(maps.Keys(m.settings)) {
		if theirs, ok := o.Settings[k]; ok && theirs != m.settings[k] {
			return &MismatchError{Setting: k, Ours: m.settings[k], Theirs: theirs, Holder: o.Holder}
		}
	}
	return nil
}

// observe records a watched member key's entry.
func (m *Membership) observe(e jetstream.KeyValueEntry) {
	if e.Key() == m.key {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.others, e.Key()) // it left, or was swept
		return
	}
	if o, ok := m.others[e.Key()]; ok && o.rev == e.Revision() {
		return
	}
	var mem Member
	if err := json.Unmarshal(e.Value(), &mem); err != nil {
		m.logger.Warn("membership value unreadable", slog.String("key", e.Key()), slog.Any("error", err))
	}
	m.others[e.Key()] = memberSeen{rev: e.Revision(), at: now, member: mem}
}

// run renews the key and follows the others until ctx ends, then leaves.
func (m *Membership) run(ctx context.Context, w jetstream.KeyWatcher, stopWatch context.CancelFunc) {
	defer close(m.done)
	defer m.leave()
	defer stopWatch()
	tick := time.NewTicker(m.ttl / 3)
	defer tick.Stop()
	updates := w.Updates()
	bidding := m.bidding
	value := m.value
	for {
		var now bool
		select {
		case <-ctx.Done():
			return
		case <-bidding:
			bidding, value, now = nil, m.value2, true
		case e, open := <-updates:
			if !open {
				// The watch ended (it survives reconnects, so this is
				// rare): others then look stopped after TTL, which
				// only makes this replica bid for more.
				m.logger.Warn("membership watch ended; restarting")
				updates = m.rewatch(ctx)
				continue
			}
			if e != nil {
				m.observe(e)
			}
		case <-tick.C:
			now = true
		}
		if now {
			pctx, cancel := context.WithTimeout(ctx, m.ttl)
			_, err := m.kv.Put(pctx, m.key, value)
			cancel()
			if err != nil && ctx.Err() == nil {
				m.logger.Warn("membership renewal failed; retrying", slog.Any("error", err))
			}
		}
	}
}

// rewatch starts a new watch of the members, or returns nil (a channel
// that never delivers) if it cannot; the next tick does not retry, but
// liveness then decays safely (see run).
func (m *Membership) rewatch(ctx context.Context) <-chan jetstream.KeyValueEntry {
	w, err := m.kv.Watch(ctx, MemberKeyPrefix+">")
	if err != nil {
		m.logger.Warn("membership watch failed", slog.Any("error", err))
		return nil
	}
	context.AfterFunc(ctx, func() { _ = w.Stop() })
	return w.Updates()
}

// leave deletes this replica's key, on a fresh context.
func (m *Membership) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.kv.Delete(ctx, m.key); err != nil {
		m.logger.Warn("membership key not deleted; others count this replica out after the TTL", slog.Any("error", err))
	}
}

// Done is closed once the membership key was deleted after Start's ctx
// ended.
func (m *Membership) Done() <-chan struct{} { return m.done }

// Live returns how many replicas are live: this one, and every other
// that bids for leases ([Member].Bidding) and whose membership key's
// revision changed within the TTL (seen by this process's monotonic
// clock).
func (m *Membership) Live() int { return len(m.Members()) }

// Members returns the holder ids of the live replicas (see
// [Membership.Live]), this one included, sorted.
func (m *Membership) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []string{m.holder}
	for k, o := range m.others {
		if o.member.Bidding && time.Since(o.at) < m.ttl {
			out = append(out, cmp.Or(o.member.Holder, strings.TrimPrefix(k, MemberKeyPrefix)))
		}
	}
	slices.Sort(out)
	return out
}

// Sweep deletes the membership keys of replicas that stopped without
// leaving (a crash): keys seen unchanged for at least after (at least
// TTL), each with a compare-and-set on the revision seen, so a replica
// that renews meanwhile keeps its key. It returns how many it deleted. A
// deleted key leaves a small delete marker in the bucket.
func (m *Membership) Sweep(ctx context.Context, after time.Duration) (int, error) {
	after = max(after, m.ttl)
	m.mu.Lock()
	stale := map[string]uint64{}
	for k, o := range m.others {
		if time.Since(o.at) >= after {
			stale[k] = o.rev
		}
	}
	m.mu.Unlock()
	n := 0
	for k, rev := range stale {
		err := m.kv.Delete(ctx, k, jetstream.LastRevision(rev))
		switch {
		case err == nil:
			n++
		case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			// renewed meanwhile: live
		default:
			return n, fmt.Errorf("lease: sweep %s: %w", k, err)
		}
	}
	return n, nil
}

// cmpErr returns err, or def if err is nil.
func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
