package deliver

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// loadHopKey reads the hop secret from the offsets bucket, creating it on
// first start.
func loadHopKey(ctx context.Context, js jetstream.JetStream) (hopKey, error) {
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	e, err := kv.Get(ctx, hopKeyName)
	if err == nil {
		return hopKey(e.Value()), nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("hop key: %w", err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if _, err := kv.Create(ctx, hopKeyName, key); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		// Another start created it meanwhile.
		if e, err = kv.Get(ctx, hopKeyName); err != nil {
			return nil, fmt.Errorf("hop key: %w", err)
		}
		return hopKey(e.Value()), nil
	}
	return hopKey(key), nil
}

// mac is the MAC of a hop message's trusted fields.
func (k hopKey) mac(subject string, h nats.Header) string {
	m := hmac.New(sha256.New, k)
	for _, v := range []string{subject, h.Get(hdrOrigin), h.Get(hdrHops), h.Get(hdrMsgID), h.Get(HeaderEnqueuedAt), h.Get(HeaderDeliverAt), h.Get(hdrMerge)} {
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
	m.h.Write([]byte("delivery-id\x00"))
	m.h.Write([]byte(ref))
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
