package deliver

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
	"github.com/delayd/delayd/offsets"
)

// A cascading message moving on to its next level re-enters the ingress
// stream, where any publisher may write. Its Delayd-* headers (first id,
// publisher id, enqueue time, hop count, merge key) are trusted only with a
// valid Delayd-Hop-Mac: an HMAC-SHA256 of them, the due time and the target,
// keyed by a secret delayd keeps in its offsets bucket (key hopKeyName),
// which publishers without JetStream API permissions cannot read. A message
// with Delayd-Origin but no valid MAC is routed as a new message, its
// Delayd-* headers dropped.
const (
	hdrHopMac  = "Delayd-Hop-Mac"
	hopKeyName = "hop-key"
)

// hopKey is the secret of hop MACs.
type hopKey []byte

// The hop secret is hopKeySize random bytes. delayd stores it as
// hopKeyPrefix + base64url(key) + "." + base64url(check), check being the
// first 12 bytes of SHA-256(hopKeyCheckLabel + key), so that a value that
// is not one delayd wrote (set by hand, cut short, overwritten) is refused
// at start instead of silently becoming another secret. Before this
// format, delayd stored the hopKeySize raw bytes themselves (legacy); such
// a value is still accepted and left as it is, so that an upgrade keeps
// its secret and an older delayd can still read it.
const (
	hopKeySize       = 32
	hopKeyPrefix     = "delayd-hop-key-v1."
	hopKeyCheckLabel = "delayd hop-key v1\x00"
)

// encodeHopKey returns the stored form of key.
func encodeHopKey(key hopKey) []byte {
	sum := sha256.Sum256(append([]byte(hopKeyCheckLabel), key...))
	return []byte(hopKeyPrefix + base64.RawURLEncoding.EncodeToString(key) + "." + base64.RawURLEncoding.EncodeToString(sum[:12]))
}

// decodeHopKey returns the secret of a stored hop-key value: the current
// format with a valid check, or a legacy value of hopKeySize raw bytes. A
// legacy value made only of printable ASCII is refused: delayd wrote
// random bytes, which are all printable with a chance of about 1e-14, so
// it was typed by hand.
func decodeHopKey(v []byte) (hopKey, error) {
	if rest, ok := bytes.CutPrefix(v, []byte(hopKeyPrefix)); ok {
		k64, _, ok := bytes.Cut(rest, []byte("."))
		key, kerr := base64.RawURLEncoding.DecodeString(string(k64))
		if !ok || kerr != nil || len(key) != hopKeySize {
			return nil, fmt.Errorf("%w: %d bytes in the %s format with a malformed key", ErrHopKey, len(v), hopKeyPrefix+"<key>.<check>")
		}
		if !bytes.Equal(encodeHopKey(key), v) {
			return nil, fmt.Errorf("%w: %d bytes in the %s format whose integrity check fails", ErrHopKey, len(v), hopKeyPrefix+"<key>.<check>")
		}
		return key, nil
	}
	if len(v) != hopKeySize {
		return nil, fmt.Errorf("%w: %d bytes, want the %s format or %d raw bytes (before it)", ErrHopKey, len(v), hopKeyPrefix+"<key>.<check>", hopKeySize)
	}
	if !slices.ContainsFunc(v, func(b byte) bool { return b < 0x20 || b > 0x7e }) {
		return nil, fmt.Errorf("%w: %d bytes of printable text, not the random bytes delayd wrote", ErrHopKey, len(v))
	}
	return hopKey(v), nil
}

// loadHopKey reads the hop secret from the offsets bucket, creating it on
// first start. A stored value that [decodeHopKey] refuses is an error
// wrapping [ErrHopKey] that names the bucket and key and says how to
// recover; delayd must not start on it.
func loadHopKey(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (hopKey, error) {
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	e, err := kv.Get(ctx, hopKeyName)
	if err == nil {
		return decodeStoredHopKey(e)
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	// A delete or purge marker (the bucket keeps it) tells a rotation from a first start.
	h, herr := kv.History(ctx, hopKeyName)
	deleted := herr == nil && len(h) > 0
	key := make([]byte, hopKeySize)
	_, _ = rand.Read(key)
	if _, err := kv.Create(ctx, hopKeyName, encodeHopKey(key)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		// Another start created it meanwhile.
		if e, err = kv.Get(ctx, hopKeyName); err != nil {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		return decodeStoredHopKey(e)
	}
	if deleted {
		// Its earlier value was deleted or purged: this is a rotation.
		logger.Warn("hop secret was deleted; created a new one: derived delivery ids change, so a stream target may store a re-delivery once more, and hops in the ingress stream signed with the old one are routed as new messages",
			slog.String("bucket", offsets.Bucket), slog.String("key", hopKeyName))
		return hopKey(key), nil
	}
	logger.Info("hop secret created", slog.String("bucket", offsets.Bucket), slog.String("key", hopKeyName))
	return hopKey(key), nil
}

// decodeStoredHopKey decodes the hop-key entry e, wrapping a refusal with
// where the value is and how to recover.
func decodeStoredHopKey(e jetstream.KeyValueEntry) (hopKey, error) {
	key, err := decodeHopKey(e.Value())
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s, key %q (revision %d): %w; delayd will not run on it, since another secret "+
			"changes every derived delivery id. To recover, put back the value delayd wrote (from a backup of the bucket), "+
			"or delete the key (nats kv del %s %s) and start delayd, which creates a new secret: a stream target may then "+
			"store a re-delivery once more, and hops waiting in the ingress stream lose their first id (README \"The hop secret\")",
			offsets.Bucket, hopKeyName, e.Revision(), err, offsets.Bucket, hopKeyName)
	}
	return key, nil
}

// mac is the MAC of a hop message's trusted fields.
func (k hopKey) mac(subject string, h nats.Header) string {
	m := hmac.New(sha256.New, k)
	for _, v := range []string{subject, h.Get(hdrOrigin), h.Get(hdrHops), h.Get(hdrMsgID), h.Get(contract.HeaderEnqueuedAt), h.Get(contract.HeaderDeliverAt), h.Get(hdrMerge)} {
		m.Write([]byte(v))
		m.Write([]byte{0})
	}
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil)[:18])
}

// sign sets the MAC of a hop message about to be published to subject.
func (k hopKey) sign(subject string, h nats.Header) {
	h[hdrHopMac] = []string{k.mac(subject, h)}
}

// hopID is the Nats-Msg-Id of a cascading message's hops-th move: the
// ingress stream drops a repeat of it after a crash. It is derived with the
// secret, so no publisher can take it first and have the real hop dropped
// as its duplicate.
func (k hopKey) hopID(origin string, hops int) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte("hop-id\x00" + origin + "\x00" + strconv.Itoa(hops)))
	return "delayd-hop-" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:18])
}

// deliveryID is the Nats-Msg-Id a message without a publisher id is
// delivered with: its derived id "delayd-<ingress created>-<seq>" (unique
// to the ingress stream's life) and a MAC of it, so no publisher can
// predict it and have a stream-bound target drop the delivery as a
// duplicate of a message it sent first under that id.
func (k hopKey) deliveryID(ref string) string {
	return k.newIDMAC().deliveryID(ref)
}

// idMAC computes delivery ids with one reused HMAC state: a scanner
// derives an id per delivery, so it keeps its own (not safe for
// concurrent use).
type idMAC struct {
	h   hash.Hash // nil without a key
	buf []byte    // the MAC's input, reused
	sum []byte
}

func (k hopKey) newIDMAC() *idMAC {
	if len(k) == 0 {
		return &idMAC{}
	}
	return &idMAC{h: hmac.New(sha256.New, k)}
}

func (m *idMAC) deliveryID(ref string) string {
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

// valid reports whether a message on subject carries a valid hop MAC.
func (k hopKey) valid(subject string, h nats.Header) bool {
	got := h.Get(hdrHopMac)
	return len(k) > 0 && got != "" && hmac.Equal([]byte(got), []byte(k.mac(subject, h)))
}
