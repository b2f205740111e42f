package offsets_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/offsets"
)

// testBundle is one test's server, JetStream client and offsets store.
type testBundle struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	kv    jetstream.KeyValue // the DELAYD_OFFSETS bucket, read directly
	store *offsets.Store
}

// startServer starts a JetStream nats-server on a free loopback port and
// registers its shutdown.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	return natstest.Start(t, nil)
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	srv := startServer(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := offsets.New(ctx(t), js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), offsets.Bucket)
	if err != nil {
		t.Fatalf("bucket %s not created: %v", offsets.Bucket, err)
	}
	return &testBundle{nc: nc, js: js, kv: kv, store: store}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// raw reads a key straight from the bucket.
func (b *testBundle) raw(t *testing.T, key string) jetstream.KeyValueEntry {
	t.Helper()
	e, err := b.kv.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("kv get %s: %v", key, err)
	}
	return e
}

func TestOffsetsLoadMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seq, err := b.store.Load(ctx(t), "DELAYD_5S")
	if !errors.Is(err, offsets.ErrNotFound) {
		t.Fatalf("Load of a missing key = %d, %v; want ErrNotFound", seq, err)
	}
	if seq != 0 {
		t.Fatalf("Load of a missing key = %d, want 0", seq)
	}
}

// TestOffsetsLoadDeleted: a key that was committed and then deleted or
// purged by hand is not found, and says so (ErrDeleted), unlike a key that
// was never written.
func TestOffsetsLoadDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.Load(ctx(t), "DELAYD_5S"); errors.Is(err, offsets.ErrDeleted) {
		t.Fatalf("never written: %v; want not ErrDeleted", err)
	}
	for _, tc := range []struct {
		op     string
		remove func(key string) error
	}{
		{"deleted", func(key string) error { return b.kv.Delete(ctx(t), key) }},
		{"purged", func(key string) error { return b.kv.Purge(ctx(t), key) }},
	} {
		if err := b.store.Commit(ctx(t), "DELAYD_5S", 7); err != nil {
			t.Fatal(err)
		}
		if err := tc.remove("DELAYD_5S"); err != nil {
			t.Fatal(err)
		}
		seq, err := b.store.Load(ctx(t), "DELAYD_5S")
		if !errors.Is(err, offsets.ErrNotFound) || !errors.Is(err, offsets.ErrDeleted) || seq != 0 {
			t.Fatalf("%s: Load = %d, %v; want 0, ErrNotFound and ErrDeleted", tc.op, seq, err)
		}
		if !strings.Contains(err.Error(), "key "+tc.op) {
			t.Errorf("%s: error %q does not say %q", tc.op, err, "key "+tc.op)
		}
	}
}

func TestOffsetsCommitLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, seq := range []uint64{0, 1, 42, 1 << 40, 1<<64 - 1} {
		if err := b.store.Commit(ctx(t), "DELAYD_5S", seq); err != nil {
			t.Fatalf("Commit(%d): %v", seq, err)
		}
		got, err := b.store.Load(ctx(t), "DELAYD_5S")
		if err != nil || got != seq {
			t.Fatalf("Load after Commit(%d) = %d, %v", seq, got, err)
		}
	}
	// Keys are independent.
	if err := b.store.Commit(ctx(t), "DELAYD_1S", 7); err != nil {
		t.Fatal(err)
	}
	if got, err := b.store.Load(ctx(t), "DELAYD_1S"); err != nil || got != 7 {
		t.Fatalf("Load(DELAYD_1S) = %d, %v; want 7", got, err)
	}
	if got, err := b.store.Load(ctx(t), "DELAYD_5S"); err != nil || got != 1<<64-1 {
		t.Fatalf("Load(DELAYD_5S) = %d, %v; want %d", got, err, uint64(1<<64-1))
	}

	// A second store (a restarted delayd) reads what the first committed.
	store2, err := offsets.New(ctx(t), b.js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := store2.Load(ctx(t), "DELAYD_1S"); err != nil || got != 7 {
		t.Fatalf("second store Load(DELAYD_1S) = %d, %v; want 7", got, err)
	}
}

func TestOffsetsCommitSameIsNoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 10); err != nil {
		t.Fatal(err)
	}
	rev := b.raw(t, "DELAYD_5S").Revision()
	for range 3 {
		if err := b.store.Commit(ctx(t), "DELAYD_5S", 10); err != nil {
			t.Fatalf("Commit of the same offset: %v", err)
		}
	}
	if got := b.raw(t, "DELAYD_5S").Revision(); got != rev {
		t.Fatalf("Commit of the same offset wrote to the bucket: revision %d -> %d", rev, got)
	}
	// Also after a Load.
	if _, err := b.store.Load(ctx(t), "DELAYD_5S"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 10); err != nil {
		t.Fatal(err)
	}
	if got := b.raw(t, "DELAYD_5S").Revision(); got != rev {
		t.Fatalf("Commit of the loaded offset wrote to the bucket: revision %d -> %d", rev, got)
	}
}

func TestOffsetsCommitRegress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 10); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{9, 1, 0} {
		err := b.store.Commit(ctx(t), "DELAYD_5S", seq)
		if !errors.Is(err, offsets.ErrRegress) {
			t.Fatalf("Commit(%d) after 10 = %v, want ErrRegress", seq, err)
		}
	}
	if got, err := b.store.Load(ctx(t), "DELAYD_5S"); err != nil || got != 10 {
		t.Fatalf("Load after refused regressions = %d, %v; want 10", got, err)
	}
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 11); err != nil {
		t.Fatalf("Commit forward after refused regressions: %v", err)
	}

	// A store that loaded the offset (a restarted delayd) refuses to regress it too.
	store2, err := offsets.New(ctx(t), b.js, offsets.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store2.Load(ctx(t), "DELAYD_5S"); err != nil {
		t.Fatal(err)
	}
	if err := store2.Commit(ctx(t), "DELAYD_5S", 5); !errors.Is(err, offsets.ErrRegress) {
		t.Fatalf("Commit(5) after Load of 11 = %v, want ErrRegress", err)
	}
}

func TestOffsetsCorrect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 100); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Correct(ctx(t), "DELAYD_5S", 3, "stream recreated"); err != nil {
		t.Fatalf("Correct backwards: %v", err)
	}
	if got, err := b.store.Load(ctx(t), "DELAYD_5S"); err != nil || got != 3 {
		t.Fatalf("Load after Correct(3) = %d, %v", got, err)
	}
	// The corrected offset is the new floor: forward from it works, below it regresses.
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 4); err != nil {
		t.Fatalf("Commit(4) after Correct(3): %v", err)
	}
	if err := b.store.Commit(ctx(t), "DELAYD_5S", 2); !errors.Is(err, offsets.ErrRegress) {
		t.Fatalf("Commit(2) after Commit(4) = %v, want ErrRegress", err)
	}
	// Correct on a key never committed works as a first write.
	if err := b.store.Correct(ctx(t), "DELAYD_1M", 0, "corrupt"); err != nil {
		t.Fatal(err)
	}
	if got, err := b.store.Load(ctx(t), "DELAYD_1M"); err != nil || got != 0 {
		t.Fatalf("Load after Correct(0) = %d, %v", got, err)
	}
}

func TestOffsetsCorrupt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, garbage := range []string{"abc", "-1", "1.5", " 5", "5 ", "0x10", "18446744073709551616", "\x00", "{\"seq\":5}"} {
		if _, err := b.kv.Put(ctx(t), "DELAYD_5S", []byte(garbage)); err != nil {
			t.Fatal(err)
		}
		seq, err := b.store.Load(ctx(t), "DELAYD_5S")
		if !errors.Is(err, offsets.ErrCorrupt) {
			t.Errorf("Load of %q = %d, %v; want ErrCorrupt", garbage, seq, err)
		}
	}
	// An empty value.
	if _, err := b.kv.Put(ctx(t), "DELAYD_5S", nil); err != nil {
		t.Fatal(err)
	}
	if seq, err := b.store.Load(ctx(t), "DELAYD_5S"); !errors.Is(err, offsets.ErrCorrupt) {
		t.Errorf("Load of an empty value = %d, %v; want ErrCorrupt", seq, err)
	}
	// Correct repairs it.
	if err := b.store.Correct(ctx(t), "DELAYD_5S", 0, "corrupt"); err != nil {
		t.Fatal(err)
	}
	if seq, err := b.store.Load(ctx(t), "DELAYD_5S"); err != nil || seq != 0 {
		t.Fatalf("Load after Correct = %d, %v", seq, err)
	}
}

func TestOffsetsDecimalText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for seq, want := range map[uint64]string{0: "0", 7: "7", 1234567890: "1234567890", 1<<64 - 1: "18446744073709551615"} {
		key := "DELAYD_" + want
		if err := b.store.Commit(ctx(t), key, seq); err != nil {
			t.Fatal(err)
		}
		if got := string(b.raw(t, key).Value()); got != want {
			t.Errorf("stored value for %d = %q, want decimal text %q", seq, got, want)
		}
	}
	// A value written by an operator with any KV client is read back.
	if _, err := b.kv.PutString(ctx(t), "DELAYD_30S", "99"); err != nil {
		t.Fatal(err)
	}
	if seq, err := b.store.Load(ctx(t), "DELAYD_30S"); err != nil || seq != 99 {
		t.Fatalf("Load of operator-written %q = %d, %v; want 99", "99", seq, err)
	}
}

func TestOffsetsBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := b.kv.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Bucket() != offsets.Bucket || st.History() != 1 {
		t.Fatalf("bucket %q history %d, want %q history 1", st.Bucket(), st.History(), offsets.Bucket)
	}
	// New is idempotent: a second call on the existing bucket works.
	if _, err := offsets.New(ctx(t), b.js, offsets.Config{}); err != nil {
		t.Fatalf("second New: %v", err)
	}
	if _, err := offsets.New(ctx(t), b.js, offsets.Config{Replicas: -1}); err == nil {
		t.Fatal("New with Replicas -1: want an error")
	}
}
