package index

import (
	"testing"
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
