package index

import (
	"testing"
	"time"
)

// TestTombstoneWire pins the tombstones' wire form and subject byte for
// byte, as delayd wrote them before this package existed: tombstones
// already stored must keep cancelling their messages after an upgrade.
// Target and At are never written.
func TestTombstoneWire(t *testing.T) {
	t.Parallel()
	tests := []struct {
		t    Tombstone
		want string
	}{
		{Tombstone{Seq: 7, Key: "u42", MergeKey: "morders.close\x00user-42", Target: "orders.close", At: 5}, "7\nu42\nmorders.close\x00user-42"},
		{Tombstone{Seq: 0, Key: "s1"}, "0\ns1\n"},
	}
	for _, tt := range tests {
		if got := string(tt.t.Encode()); got != tt.want {
			t.Errorf("Encode(%+v) = %q, want %q", tt.t, got, tt.want)
		}
	}
	if got := TombstoneSubject("DELAYD_5S"); got != "delayd.cancels.DELAYD_5S" {
		t.Errorf("TombstoneSubject = %q", got)
	}
}

// TestDecodeTombstone: what each input decodes to, exactly, and which
// inputs are refused.
func TestDecodeTombstone(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want Tombstone // At 9 unless refused
		ok   bool
	}{
		{"with merge key", "7\nu42\nmorders.close\x00user-42", Tombstone{Seq: 7, Key: "u42", MergeKey: "morders.close\x00user-42", At: 9}, true},
		{"empty merge key", "7\nu42\n", Tombstone{Seq: 7, Key: "u42", At: 9}, true},
		{"no merge key line", "7\nu42", Tombstone{Seq: 7, Key: "u42", At: 9}, true},
		{"merge key keeps later newlines", "7\nu42\nm\na\nb", Tombstone{Seq: 7, Key: "u42", MergeKey: "m\na\nb", At: 9}, true},
		{"largest sequence", "18446744073709551615\ns1", Tombstone{Seq: 1<<64 - 1, Key: "s1", At: 9}, true},
		{"leading zeros", "007\ns1", Tombstone{Seq: 7, Key: "s1", At: 9}, true},

		{"empty", "", Tombstone{}, false},
		{"no newline", "7", Tombstone{}, false},
		{"empty key", "7\n\nmx", Tombstone{}, false},
		{"sequence not a number", "not a tombstone\nu42", Tombstone{}, false},
		{"empty sequence", "\nu42", Tombstone{}, false},
		{"negative sequence", "-7\nu42", Tombstone{}, false},
		{"signed sequence", "+7\nu42", Tombstone{}, false},
		{"sequence beyond uint64", "18446744073709551616\nu42", Tombstone{}, false},
		{"space in the sequence", "7 \nu42", Tombstone{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := DecodeTombstone([]byte(tt.in), 9)
			if ok != tt.ok || got != tt.want {
				t.Errorf("DecodeTombstone(%q) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzDecodeTombstone: decoding arbitrary bytes never panics, a tombstone
// it accepts has a key, and it survives a round trip: re-encoded and
// decoded again, it is the same, and encodes to the same bytes.
func FuzzDecodeTombstone(f *testing.F) {
	f.Add([]byte("7\nu42\nmorders.close\x00user-42"), uint64(3))
	f.Add([]byte("7\nu42"), uint64(0))
	f.Add([]byte("007\nu\n\n"), uint64(1))
	f.Add([]byte("x\n"), uint64(1))
	f.Fuzz(func(t *testing.T, data []byte, at uint64) {
		tb, ok := DecodeTombstone(data, at)
		if !ok {
			if tb != (Tombstone{}) {
				t.Fatalf("refused %q but returned %+v", data, tb)
			}
			return
		}
		if tb.Key == "" || tb.At != at || tb.Target != "" {
			t.Fatalf("DecodeTombstone(%q, %d) = %+v", data, at, tb)
		}
		again := tb.Encode()
		tb2, ok := DecodeTombstone(again, at)
		if !ok || tb2 != tb {
			t.Fatalf("%+v re-encoded as %q decodes to %+v, %v", tb, again, tb2, ok)
		}
		if twice := tb2.Encode(); string(twice) != string(again) {
			t.Fatalf("re-encoding is not stable: %q then %q", again, twice)
		}
	})
}

// TestTombstoneIntentWire: a move's intent and its placed mark read back
// as written, and a delayd that knows no moves reads them as
// docs/pending.md#25-safety-delivered-once-at-the-old-due-or-once-at-the-new-one
// says: an intent's body is exactly a cancel's tombstone (the new due is a
// header only), and a placed mark's body is refused. A cancel's tombstone
// message carries no headers, as before.
func TestTombstoneIntentWire(t *testing.T) {
	t.Parallel()
	due := time.Date(2026, 12, 3, 9, 0, 0, 120000000, time.UTC)
	intent := Tombstone{Seq: 7, Key: "u42", MergeKey: "morders.close\x00user-42", Target: "orders.close", Move: due}
	m := intent.Msg("DELAYD_5S")
	if m.Subject != "delayd.cancels.DELAYD_5S" {
		t.Fatalf("intent subject %q", m.Subject)
	}
	cancelOnly := intent
	cancelOnly.Move, cancelOnly.Target = time.Time{}, ""
	if string(m.Data) != string(cancelOnly.Encode()) {
		t.Fatalf("intent body %q, want a cancel tombstone's %q", m.Data, cancelOnly.Encode())
	}
	if got := m.Header.Get(HdrMoveDue); got != "2026-12-03T09:00:00.120000000Z" {
		t.Fatalf("intent %s = %q", HdrMoveDue, got)
	}
	got, ok := DecodeTombstoneMsg(m, 11)
	want := intent
	want.At = 11
	if !ok || got.Seq != want.Seq || got.Key != want.Key || got.MergeKey != want.MergeKey || got.Target != want.Target || !got.Move.Equal(due) || got.At != 11 {
		t.Fatalf("DecodeTombstoneMsg(intent) = %+v, %v; want %+v", got, ok, want)
	}
	old, ok := DecodeTombstone(m.Data, 11)
	if !ok || old.Seq != 7 || old.Key != "u42" || old.MergeKey != intent.MergeKey || !old.Move.IsZero() {
		t.Fatalf("an older delayd reads the intent as %+v, %v; want the cancel of 7 with its merge key", old, ok)
	}

	plain := Tombstone{Seq: 7, Key: "u42", Target: "orders.close"}.Msg("DELAYD_5S")
	if plain.Header != nil || string(plain.Data) != "7\nu42\n" {
		t.Fatalf("a cancel's tombstone message: headers %v, body %q; want none, %q", plain.Header, plain.Data, "7\nu42\n")
	}
	if got, ok := DecodeTombstoneMsg(plain, 3); !ok || !got.Move.IsZero() || got.Target != "" || got.Key != "u42" {
		t.Fatalf("DecodeTombstoneMsg(cancel) = %+v, %v", got, ok)
	}

	mark := PlacedMark{Intent: 11}.Msg("DELAYD_5S")
	if mark.Subject != "delayd.cancels.DELAYD_5S" || string(mark.Data) != "moved 11" || mark.Header.Get(HdrMoved) != "11" {
		t.Fatalf("placed mark %q %v %q", mark.Subject, mark.Header, mark.Data)
	}
	if p, ok := DecodePlacedMark(mark, 12); !ok || p != (PlacedMark{Intent: 11, At: 12}) {
		t.Fatalf("DecodePlacedMark = %+v, %v", p, ok)
	}
	if got, ok := DecodeTombstone(mark.Data, 12); ok {
		t.Fatalf("an older delayd reads the placed mark as the tombstone %+v", got)
	}
	if got, ok := DecodeTombstoneMsg(mark, 12); ok {
		t.Fatalf("DecodeTombstoneMsg reads the placed mark as the tombstone %+v", got)
	}
	if p, ok := DecodePlacedMark(m, 11); ok {
		t.Fatalf("DecodePlacedMark reads the intent as %+v", p)
	}
	bad := intent.Msg("DELAYD_5S")
	bad.Header.Set(HdrMoveDue, "soon")
	if got, ok := DecodeTombstoneMsg(bad, 11); ok {
		t.Fatalf("an intent with an unreadable due decodes as %+v", got)
	}
}
