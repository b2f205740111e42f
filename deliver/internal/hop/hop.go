package hop

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/internal/hedge"
	"github.com/delayd/delayd/offsets"
)

// A cascading message moving on to its next level re-enters the ingress
// stream, where any publisher may write. Its Delayd-* headers (first id,
// publisher id, enqueue time, hop count, merge key, and the move count of a
// rescheduled message) are trusted only with a valid Delayd-Hop-Mac: an
// HMAC-SHA256 of them, the due time and the target, keyed by a secret
// delayd keeps in its offsets bucket (key KeyName),
// which publishers without JetStream API permissions cannot read. A message
// with Delayd-Origin but no valid MAC is routed as a new message, its
// Delayd-* headers dropped.
const (
	HdrMac  = "Delayd-Hop-Mac"
	KeyName = "hop-key"
)

// Key is the secret of hop MACs.
type Key []byte

// The hop secret is KeySize random bytes. delayd stores it as
// keyPrefix + base64url(key) + "." + base64url(check), check being the
// first 12 bytes of SHA-256(keyCheckLabel + key), so that a value that
// is not one delayd wrote (set by hand, cut short, overwritten) is refused
// at start instead of silently becoming another secret. Before this
// format, delayd stored the KeySize raw bytes themselves (legacy); such
// a value is still accepted and left as it is, so that an upgrade keeps
// its secret and an older delayd can still read it.
const (
	KeySize       = 32
	keyPrefix     = "delayd-hop-key-v1."
	keyCheckLabel = "delayd hop-key v1\x00"
)

// encodeKey returns the stored form of key.
func encodeKey(key Key) []byte {
	sum := sha256.Sum256(append([]byte(keyCheckLabel), key...))
	return []byte(keyPrefix + base64.RawURLEncoding.EncodeToString(key) + "." + base64.RawURLEncoding.EncodeToString(sum[:12]))
}

// decodeKey returns the secret of a stored hop-key value: the current
// format with a valid check, or a legacy value of KeySize raw bytes. A
// legacy value made only of printable ASCII is refused: delayd wrote
// random bytes, which are all printable with a chance of about 1e-14, so
// it was typed by hand.
func decodeKey(v []byte) (Key, error) {
	if rest, ok := bytes.CutPrefix(v, []byte(keyPrefix)); ok {
		k64, _, ok := bytes.Cut(rest, []byte("."))
		key, kerr := base64.RawURLEncoding.DecodeString(string(k64))
		if !ok || kerr != nil || len(key) != KeySize {
			return nil, fmt.Errorf("%w: %d bytes in the %s format with a malformed key", ErrKey, len(v), keyPrefix+"<key>.<check>")
		}
		if !bytes.Equal(encodeKey(key), v) {
			return nil, fmt.Errorf("%w: %d bytes in the %s format whose integrity check fails", ErrKey, len(v), keyPrefix+"<key>.<check>")
		}
		return key, nil
	}
	if len(v) != KeySize {
		return nil, fmt.Errorf("%w: %d bytes, want the %s format or %d raw bytes (before it)", ErrKey, len(v), keyPrefix+"<key>.<check>", KeySize)
	}
	if !slices.ContainsFunc(v, func(b byte) bool { return b < 0x20 || b > 0x7e }) {
		return nil, fmt.Errorf("%w: %d bytes of printable text, not the random bytes delayd wrote", ErrKey, len(v))
	}
	return Key(v), nil
}

// Load reads the hop secret from the offsets bucket, creating it on
// first start. A stored value that [decodeKey] refuses is an error
// wrapping [ErrKey] that names the bucket and key and says how to
// recover; delayd must not start on it.
func Load(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (Key, error) {
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	kv = hedge.KV(kv)
	e, err := kv.Get(ctx, KeyName)
	if err == nil {
		return decodeStored(e)
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	// A delete or purge marker (the bucket keeps it) tells a rotation from a first start.
	h, herr := kv.History(ctx, KeyName)
	deleted := herr == nil && len(h) > 0
	key := make([]byte, KeySize)
	_, _ = rand.Read(key)
	if _, err := kv.Create(ctx, KeyName, encodeKey(key)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		// Another start created it meanwhile.
		if e, err = kv.Get(ctx, KeyName); err != nil {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		return decodeStored(e)
	}
	if deleted {
		// Its earlier value was deleted or purged: this is a rotation.
		logger.Warn("hop secret was deleted; created a new one: derived delivery ids change, so a stream target may store a re-delivery once more, and hops in the ingress stream signed with the old one are routed as new messages",
			slog.String("bucket", offsets.Bucket), slog.String("key", KeyName))
		return Key(key), nil
	}
	logger.Info("hop secret created", slog.String("bucket", offsets.Bucket), slog.String("key", KeyName))
	return Key(key), nil
}

// decodeStored decodes the hop-key entry e, wrapping a refusal with
// where the value is and how to recover.
func decodeStored(e jetstream.KeyValueEntry) (Key, error) {
	key, err := decodeKey(e.Value())
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s, key %q (revision %d): %w; delayd will not run on it, since another secret "+
			"changes every derived delivery id. To recover, put back the value delayd wrote (from a backup of the bucket), "+
			"or delete the key (nats kv del %s %s) and start delayd, which creates a new secret: a stream target may then "+
			"store a re-delivery once more, and hops waiting in the ingress stream lose their first id (docs/operations.md#the-hop-secret)",
			offsets.Bucket, KeyName, e.Revision(), err, offsets.Bucket, KeyName)
	}
	return key, nil
}

// mac is the MAC of a hop message's trusted fields.
func (k Key) mac(subject string, h nats.Header) string {
	m := hmac.New(sha256.New, k)
	for _, v := range []string{subject, h.Get(message.HdrOrigin), h.Get(message.HdrHops), h.Get(message.HdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(contract.HeaderDeliverAt), h.Get(message.HdrMerge)} {
		m.Write([]byte(v))
		m.Write([]byte{0})
	}
	// The move count only when present: a hop signed before it existed (in
	// the ingress stream across an upgrade) keeps a valid MAC.
	if moves := h.Get(message.HdrMoves); moves != "" {
		m.Write([]byte(moves))
		m.Write([]byte{0})
	}
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil)[:18])
}

// Sign sets the MAC of a hop message about to be published to subject.
func (k Key) Sign(subject string, h nats.Header) {
	h[HdrMac] = []string{k.mac(subject, h)}
}

// HopID is the Nats-Msg-Id of a cascading message's hops-th move: the
// ingress stream drops a repeat of it after a crash. It is derived with the
// secret, so no publisher can take it first and have the real hop dropped
// as its duplicate.
func (k Key) HopID(origin string, hops int) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte("hop-id\x00" + origin + "\x00" + strconv.Itoa(hops)))
	return "delayd-hop-" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// MoveID is the Nats-Msg-Id of the new message of a move (a reschedule;
// docs/pending.md#22-the-writes-in-order) of the level message at seq in
// stream, whose first id is origin: every copy of it (a worker's retry,
// a mover's after a failover) carries the same id, so the ingress stream
// stores one. Keyed by the secret like [Key.HopID], and distinct from
// every hop id (another label and prefix).
func (k Key) MoveID(origin, stream string, seq uint64) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte("move-id\x00" + origin + "\x00" + stream + "\x00" + strconv.FormatUint(seq, 10)))
	return "delayd-move-" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// DeliveryID is the Nats-Msg-Id a message without a publisher id is
// delivered with: its derived id "delayd-<ingress created>-<seq>" (unique
// to the ingress stream's life) and a MAC of it, so no publisher can
// predict it and have a stream-bound target drop the delivery as a
// duplicate of a message it sent first under that id.
func (k Key) DeliveryID(ref string) string {
	return k.NewIDMAC().DeliveryID(ref)
}

// IDMAC computes delivery ids with one reused HMAC state: a scanner
// derives an id per delivery, so it keeps its own (not safe for
// concurrent use).
type IDMAC struct {
	h   hash.Hash // nil without a key
	buf []byte    // the MAC's input, reused
	sum []byte
}

// NewIDMAC returns an [IDMAC] of k; without a key, its delivery id is the
// reference itself.
func (k Key) NewIDMAC() *IDMAC {
	if len(k) == 0 {
		return &IDMAC{}
	}
	return &IDMAC{h: hmac.New(sha256.New, k)}
}

// DeliveryID is [Key.DeliveryID] with m's reused state.
func (m *IDMAC) DeliveryID(ref string) string {
	if m.h == nil {
		return ref
	}
	m.h.Reset()
	// One write of a reused buffer: a []byte(ref) passed to the hash
	// would be a copy allocated per delivery.
	m.buf = append(append(m.buf[:0], "delivery-id\x00"...), ref...)
	m.h.Write(m.buf)
	m.sum = m.h.Sum(m.sum[:0])
	var enc [12]byte
	base64.RawURLEncoding.Encode(enc[:], m.sum[:9])
	return ref + "-" + string(enc[:])
}

// DeliveredSeq reads id as the Nats-Msg-Id a message without a publisher
// id was delivered with ([Key.DeliveryID]): the ingress stream's life
// it names (its creation time, Unix ns in decimal) and the first ingress
// sequence in that life, if its MAC is valid. A forged or mistyped one
// reads as no sequence (then it is only a publisher's id, usually
// unknown). The sequence names a message only in that life of the
// ingress stream: the cancel API's idKeys (deliver/internal/cancelapi) checks it.
func (k Key) DeliveredSeq(id string) (life string, seq uint64, ok bool) {
	const macLen = 1 + 12 // "-" and 9 bytes, base64url
	if len(k) == 0 || len(id) <= macLen || id[len(id)-macLen] != '-' {
		return "", 0, false
	}
	ref := id[:len(id)-macLen]
	life, seq, ok = message.ParseIngressRef(ref)
	if !ok || !hmac.Equal([]byte(k.DeliveryID(ref)), []byte(id)) {
		return "", 0, false
	}
	return life, seq, true
}

// Valid reports whether a message on subject carries a valid hop MAC.
func (k Key) Valid(subject string, h nats.Header) bool {
	got := h.Get(HdrMac)
	return len(k) > 0 && got != "" && hmac.Equal([]byte(got), []byte(k.mac(subject, h)))
}
