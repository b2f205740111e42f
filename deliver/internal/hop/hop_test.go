package hop

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// TestLoadHopKey stores hop-key values in a real offsets bucket and loads
// them: a secret delayd wrote (today's format, or the 32 raw bytes delayd
// wrote before it) is accepted as that exact key and left as it is;
// anything else is refused with an error wrapping ErrKey that names the
// bucket and key and says how to recover.
func TestLoadHopKey(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t)
	ctx := context.Background()
	discard := slog.New(slog.DiscardHandler)
	if _, err := offsets.New(ctx, js, offsets.Config{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, offsets.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(v []byte) {
		t.Helper()
		if _, err := kv.Put(ctx, KeyName, v); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() []byte {
		t.Helper()
		e, err := kv.Get(ctx, KeyName)
		if err != nil {
			t.Fatal(err)
		}
		return e.Value()
	}

	// First start: a new secret in today's format, read back as the same key.
	created, err := Load(ctx, js, discard)
	if err != nil {
		t.Fatal(err)
	}
	current := stored()
	if len(created) != KeySize || !bytes.HasPrefix(current, []byte(keyPrefix)) {
		t.Fatalf("created a %d-byte key stored as %q, want %d bytes stored as %s…", len(created), current, KeySize, keyPrefix)
	}
	if again, err := Load(ctx, js, discard); err != nil || !bytes.Equal(again, created) {
		t.Fatalf("reload: %x, %v; want %x", again, err, created)
	}

	// A legacy key (what delayd stored before: 32 raw random bytes) is the key itself, and is not rewritten.
	legacy := make([]byte, KeySize)
	_, _ = rand.Read(legacy)
	legacy[0] = 0xff // not printable, as random bytes almost surely are not
	put(legacy)
	if got, err := Load(ctx, js, discard); err != nil || !bytes.Equal(got, legacy) {
		t.Fatalf("legacy key: %x, %v; want %x", got, err, legacy)
	}
	if !bytes.Equal(stored(), legacy) {
		t.Fatalf("legacy key rewritten as %q", stored())
	}

	flip := func(v []byte, i int) []byte {
		v = bytes.Clone(v)
		if v[i] == 'A' {
			v[i] = 'B'
		} else {
			v[i] = 'A'
		}
		return v
	}
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"garbage", []byte("garbage")},
		{"legacy cut short", legacy[:31]},
		{"legacy too long", append(bytes.Clone(legacy), 0)},
		{"32 bytes of text", []byte("0123456789abcdef0123456789abcdef")},
		{"check changed", flip(current, len(current)-1)},
		{"key changed", flip(current, len(keyPrefix)+3)},
		{"no check", current[:len(keyPrefix)+43]},
		{"empty", []byte{}},
	} {
		put(tc.value)
		got, err := Load(ctx, js, discard)
		if !errors.Is(err, ErrKey) {
			t.Errorf("%s (%q): got key %x, err %v; want ErrKey", tc.name, tc.value, got, err)
			continue
		}
		for _, want := range []string{offsets.Bucket, `"` + KeyName + `"`, "nats kv del " + offsets.Bucket + " " + KeyName} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, want)
			}
		}
		if !bytes.Equal(stored(), tc.value) {
			t.Errorf("%s: the refused value was overwritten with %q", tc.name, stored())
		}
	}

	// Deleted (the recovery the error names): a new secret, logged as a rotation.
	if err := kv.Delete(ctx, KeyName); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	rotated, err := Load(ctx, js, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil || len(rotated) != KeySize || bytes.Equal(rotated, created) {
		t.Fatalf("after delete: %x, %v; want a new %d-byte key", rotated, err, KeySize)
	}
	if !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), "hop secret was deleted") {
		t.Errorf("rotation not logged as a warning: %q", logged.String())
	}
}

func TestDeliveryIDStable(t *testing.T) {
	t.Parallel()
	k := Key("0123456789abcdef0123456789abcdef")
	m := k.NewIDMAC()
	a, b := m.DeliveryID("delayd-1-2"), m.DeliveryID("delayd-1-3")
	if a != k.DeliveryID("delayd-1-2") || a == b || !strings.HasPrefix(a, "delayd-1-2-") || len(a) != len("delayd-1-2-")+12 {
		t.Errorf("delivery ids %q, %q", a, b)
	}
	if other := Key("another key").DeliveryID("delayd-1-2"); other == a {
		t.Errorf("the id does not depend on the key: %q", other)
	}
	if got := Key(nil).DeliveryID("delayd-1-2"); got != "delayd-1-2" {
		t.Errorf("without a key: %q", got)
	}
}

// TestMoveIDDeterministic: a move's id is the same for the same key,
// origin, level stream and sequence (every copy of the new message carries
// it, so the ingress stream stores one), and differs when any of them
// differs, the boundaries between them included; it is never a hop's id.
func TestMoveIDDeterministic(t *testing.T) {
	t.Parallel()
	k := Key(bytes.Repeat([]byte{7}, KeySize))
	const origin, stream = "delayd-1764752400000000000-42", "DELAYD_5S"
	id := k.MoveID(origin, stream, 12)
	if !strings.HasPrefix(id, "delayd-move-") || id != k.MoveID(origin, stream, 12) {
		t.Fatalf("MoveID %q, then %q: want one id with prefix delayd-move-", id, k.MoveID(origin, stream, 12))
	}
	others := map[string]string{
		"another origin":   k.MoveID(origin+"0", stream, 12),
		"another stream":   k.MoveID(origin, "DELAYD_1M", 12),
		"another sequence": k.MoveID(origin, stream, 13),
		"stream|seq moved": k.MoveID(origin, stream+"1", 2),
		"another key":      Key(bytes.Repeat([]byte{8}, KeySize)).MoveID(origin, stream, 12),
	}
	for what, other := range others {
		if other == id {
			t.Errorf("%s: the same move id %q", what, id)
		}
	}
	for hops := range 20 {
		if h := k.HopID(origin, hops); h == id || h == k.MoveID(origin, stream, uint64(hops)) {
			t.Errorf("HopID(%d) %q equals a move id", hops, h)
		}
	}
}

// TestMACMoveCount: a hop's MAC covers its move count (Delayd-Moves) when
// it has one, so a count added to a signed hop, changed or removed fails
// the MAC; a hop signed without one (before the count existed) still
// validates.
func TestMACMoveCount(t *testing.T) {
	t.Parallel()
	k := Key(bytes.Repeat([]byte{7}, KeySize))
	const subject = "delayd.in.orders.close"
	base := func() nats.Header {
		return nats.Header{message.HdrOrigin: {"delayd-1-7"}, message.HdrHops: {"1"}, message.HdrMsgID: {"order-42"},
			contract.HeaderEnqueuedAt: {"2026-12-03T12:00:00.000000000Z"}, contract.HeaderDeliverAt: {"2026-12-03T14:00:00.000000000Z"}}
	}
	plain := base()
	k.Sign(subject, plain)
	if !k.Valid(subject, plain) {
		t.Fatal("a hop signed without a move count does not validate")
	}
	// What a delayd before the move count signed: the same seven fields.
	before := hmac.New(sha256.New, k)
	for _, v := range []string{subject, "delayd-1-7", "1", "order-42", "2026-12-03T12:00:00.000000000Z", "2026-12-03T14:00:00.000000000Z", ""} {
		before.Write([]byte(v + "\x00"))
	}
	if old := base64.RawStdEncoding.EncodeToString(before.Sum(nil)[:18]); plain.Get(HdrMac) != old {
		t.Fatalf("a hop without a move count is signed %q, not %q as before the count: hops in flight across an upgrade would fail", plain.Get(HdrMac), old)
	}
	moved := base()
	moved[message.HdrMoves] = []string{"1"}
	k.Sign(subject, moved)
	if !k.Valid(subject, moved) {
		t.Fatal("a hop signed with a move count does not validate")
	}
	added := maps.Clone(plain)
	added[message.HdrMoves] = []string{"5"}
	changed := maps.Clone(moved)
	changed[message.HdrMoves] = []string{"2"}
	removed := maps.Clone(moved)
	delete(removed, message.HdrMoves)
	for what, h := range map[string]nats.Header{"added": added, "changed": changed, "removed": removed} {
		if k.Valid(subject, h) {
			t.Errorf("a hop whose Delayd-Moves was %s still validates: %v", what, h)
		}
	}
}
