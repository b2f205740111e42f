package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
)

// BucketName is the key-value bucket that holds the leases.
const BucketName = "DELAYD_LEASES"

// TTLDefault is a lease's default TTL, T: a holder that cannot renew for T
// loses the lease to a contender, and its own term ends T - margin after
// its last successful renewal was sent.
const TTLDefault = 1500 * time.Millisecond

// ValueVersion is the version of the [Value] encoding this package writes.
const ValueVersion = 1

// BucketConfig configures [OpenBucket].
type BucketConfig struct {
	// Replicas is the bucket's replica count: 3 on a 3-node cluster (R3),
	// 1 on a single server. Optional. Default 1.
	Replicas int
}

// Bucket is the [BucketName] key-value bucket. It is safe for concurrent
// use; each [Lease] owns one key in it.
type Bucket struct {
	kv jetstream.KeyValue
	js jetstream.JetStream // for the bucket's stream state; nil in some tests
}

// OpenBucket creates or updates the [BucketName] bucket (file storage,
// history 1) and returns it. It returns an error for Replicas < 0 and when
// JetStream refuses the bucket (for example more replicas than nodes).
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Bucket, error) {
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("lease: replicas %d: must be at least 1", cfg.Replicas)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketName,
		Description: `delayd: leases, one key per owned piece of work; value {"v":1,"holder":...,"epoch":...}`,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lease: create bucket %s: %w", BucketName, err)
	}
	return &Bucket{kv: hedge.KV(kv), js: js}, nil
}

// createWait bounds BindBucket's create of a missing bucket before it
// looks whether the bucket exists after all.
const createWait = 3 * time.Second

// BindBucket returns the [BucketName] bucket as it is, and creates it as
// [OpenBucket] does only if it does not exist: a replica that may yet
// refuse to start (a setting differs from a live replica's,
// [Membership.Start]) changes nothing of it. It returns an error if the
// bucket cannot be read or created.
func BindBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Bucket, error) {
	// Replicas started together look the bucket up and create it at once,
	// and requests sent at once to a cluster while it creates a stream may
	// go unanswered though they take effect (nats-server v2.15.2; a look-up
	// went unanswered for 10 s in CI under -race): each request gets
	// createWait, and one left unanswered is followed by a new look.
	for {
		lctx, cancel := context.WithTimeout(ctx, createWait)
		kv, err := js.KeyValue(lctx, BucketName)
		cancel()
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			cctx, cancel := context.WithTimeout(ctx, createWait)
			var b *Bucket
			b, err = OpenBucket(cctx, js, cfg)
			cancel()
			if err == nil {
				return b, nil
			}
		}
		switch {
		case err == nil:
			return &Bucket{kv: hedge.KV(kv), js: js}, nil
		case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			continue // unanswered: look again
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return nil, fmt.Errorf("lease: bucket %s: %w", BucketName, cmpErr(ctx.Err(), err))
		default:
			return nil, fmt.Errorf("lease: bucket %s: %w", BucketName, err)
		}
	}
}

// Entry is one lease key's stored state, for observability (delayctl
// stats, /metrics): who holds what, at which epoch. It says nothing about
// whether the holder is still valid: only the holder can tell.
type Entry struct {
	// Key is the lease's key, e.g. "level.DELAYD_5S".
	Key string
	// Value is the decoded value; zero if Err is set.
	Value Value
	// Revision is the key's KV revision.
	Revision uint64
	// Err wraps [ErrCorrupt] when the stored value does not decode.
	Err error
}

// Leases returns every lease key's entry, sorted by key; keys deleted or
// purged by hand, and membership keys ([MemberKeyPrefix]), are left out. It returns an error if the bucket cannot be
// read.
func (b *Bucket) Leases(ctx context.Context) ([]Entry, error) {
	w, err := b.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("lease: list %s: %w", BucketName, err)
	}
	defer func() { _ = w.Stop() }()
	latest := make(map[string]jetstream.KeyValueEntry)
	for e := range w.Updates() {
		if e == nil {
			break // the current values are all delivered
		}
		if strings.HasPrefix(e.Key(), MemberKeyPrefix) {
			continue // a membership key, not a lease
		}
		latest[e.Key()] = e // a key written while listing comes again, newer
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("lease: list %s: %w", BucketName, err)
	}
	out := make([]Entry, 0, len(latest))
	for k, e := range latest {
		v, derr := DecodeValue(e.Value())
		out = append(out, Entry{Key: k, Value: v, Revision: e.Revision(), Err: derr})
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Value is a lease key's value: who holds it, at which epoch. Encoded as
// JSON {"v":1,"holder":"...","epoch":N}; an empty Holder means released.
type Value struct {
	// Version is the encoding's version, [ValueVersion].
	Version int `json:"v"`
	// Holder is the holding replica's id ([NewHolderID]); empty when the
	// lease was released.
	Holder string `json:"holder"`
	// Epoch is the holder's term number, 1 for the first holder. It
	// increases on every change of holder and stays the same across
	// renewals and the release.
	Epoch uint64 `json:"epoch"`
}

// DecodeValue decodes a lease value. It returns an error wrapping
// [ErrCorrupt] for anything but a JSON object of a known version.
func DecodeValue(b []byte) (Value, error) {
	var v Value
	if err := json.Unmarshal(b, &v); err != nil {
		return Value{}, fmt.Errorf("%w: %q: %w", ErrCorrupt, b, err)
	}
	if v.Version != ValueVersion {
		return Value{}, fmt.Errorf("%w: %q: version %d, want %d", ErrCorrupt, b, v.Version, ValueVersion)
	}
	return v, nil
}

func (v Value) encode() []byte {
	v.Version = ValueVersion
	b, _ := json.Marshal(v) // a struct of a string and numbers always marshals
	return b
}

// NewHolderID returns a holder id unique to this process's life:
// "<hostname>-<pid>-<8 random hex digits>", e.g. "web-1-4242-9f2c01ab"
// (a hostname's characters other than letters, digits, - and _ become _). A
// restarted process gets a new id, so it never mistakes its previous life's
// lease for its own.
func NewHolderID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "delayd"
	}
	// The id is also a key token ([MemberKey]): other characters become _.
	host = strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			return c
		}
		return '_'
	}, strings.Trim(host, "."))
	var r [4]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:]))
}
