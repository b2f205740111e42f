package levels

import (
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePartitions(t *testing.T) {
	p, err := ParsePartitions(" 5m=2,1m=4\t90s=1 ")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != "1m=4 5m=2" {
		t.Errorf("String() = %q, want %q (count 1 left out)", got, "1m=4 5m=2")
	}
	if p.Count(time.Minute) != 4 || p.Count(90*time.Second) != 1 || p.Count(time.Hour) != 1 {
		t.Errorf("counts: 1m %d, 90s %d, 1h %d; want 4, 1, 1", p.Count(time.Minute), p.Count(90*time.Second), p.Count(time.Hour))
	}
	want := []string{"DELAYD_1M-P0", "DELAYD_1M-P1", "DELAYD_1M-P2", "DELAYD_1M-P3"}
	if got := p.Streams(time.Minute); len(got) != 4 || got[0] != want[0] || got[3] != want[3] {
		t.Errorf("Streams(1m) = %v, want %v", got, want)
	}
	if got := p.Streams(90 * time.Second); len(got) != 1 || got[0] != "DELAYD_1M30S" {
		t.Errorf("Streams(90s) = %v, want [DELAYD_1M30S]", got)
	}
	if err := p.Check(MustParse("1m 90s 5m")); err != nil {
		t.Errorf("Check: %v", err)
	}
	if err := p.Check(MustParse("1m 90s 10m")); !errors.Is(err, ErrBadPartitions) {
		t.Errorf("Check of a table without 5m: %v, want ErrBadPartitions", err)
	}
	for _, bad := range []string{"1m", "1m=0", "1m=65", "1m=x", "1m=2 60s=2", "0s=2", "1x=2", "=2"} {
		if _, err := ParsePartitions(bad); !errors.Is(err, ErrBadPartitions) {
			t.Errorf("ParsePartitions(%q) = %v, want ErrBadPartitions", bad, err)
		}
	}
	if p, err := ParsePartitions(""); err != nil || p.String() != "" {
		t.Errorf("ParsePartitions(\"\") = %q, %v; want none", p.String(), err)
	}
}

func TestParseStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    time.Duration
		part int
		ok   bool
	}{
		{"DELAYD_1M", time.Minute, -1, true},
		{"DELAYD_1M-P0", time.Minute, 0, true},
		{"DELAYD_1M30S-P63", 90 * time.Second, 63, true},
		{"DELAYD_1M-P64", 0, 0, false},
		{"DELAYD_1M-P01", 0, 0, false},
		{"DELAYD_1M-P", 0, 0, false},
		{"DELAYD_1M-P-1", 0, 0, false},
		{"DELAYD_90S-P0", 0, 0, false},
		{"DELAYD_INGRESS", 0, 0, false},
	} {
		d, part, ok := ParseStream(tc.name)
		if d != tc.d || part != tc.part || ok != tc.ok {
			t.Errorf("ParseStream(%q) = %v, %d, %v; want %v, %d, %v", tc.name, d, part, ok, tc.d, tc.part, tc.ok)
		}
		if pd, pok := ParseStreamName(tc.name); pok != tc.ok || pd != tc.d {
			t.Errorf("ParseStreamName(%q) = %v, %v; want %v, %v", tc.name, pd, pok, tc.d, tc.ok)
		}
	}
	if got := PartitionStreamName(time.Minute, 3); got != "DELAYD_1M-P3" {
		t.Errorf("PartitionStreamName(1m, 3) = %q", got)
	}
}

// TestPartitionOf: the partition is FNV-1a 32 of the key's bytes mod n, the
// documented hash every replica and version must agree on.
func TestPartitionOf(t *testing.T) {
	for i := range 200 {
		key := "orders.k" + strconv.Itoa(i)
		h := fnv.New32a()
		h.Write([]byte(key))
		for _, n := range []int{2, 3, 4, 64} {
			if got, want := PartitionOf(key, n), int(h.Sum32()%uint32(n)); got != want {
				t.Fatalf("PartitionOf(%q, %d) = %d, want %d", key, n, got, want)
			}
		}
	}
	if PartitionOf("x", 1) != 0 || PartitionOf("x", 0) != 0 {
		t.Error("PartitionOf with fewer than 2 partitions is not 0")
	}
	// Fixed values: a change of the hash would move keys between partitions.
	if got := PartitionOf("a", 64); got != 0xe40c292c%64 {
		t.Errorf("PartitionOf(a, 64) = %d, want %d", got, 0xe40c292c%64)
	}
}

// TestPartitionsWithIngress: with N ingress partitions every level without a count of its own, the immediate and
// precision levels too, has N partitions; a count of its own must be a multiple of N; partition j's router is j mod
// N; String is the list as given.
func TestPartitionsWithIngress(t *testing.T) {
	tbl := MustParse("1s 1m")
	p, err := ParsePartitions("1m=8")
	if err != nil {
		t.Fatal(err)
	}
	q := p.WithIngress(4)
	if err := q.Check(tbl); err != nil {
		t.Fatalf("1m=8 with 4 ingress partitions: %v", err)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 4}, {time.Millisecond, 4}, {time.Second, 4}, {time.Minute, 8}} {
		if got := q.Count(tc.d); got != tc.want {
			t.Errorf("Count(%s) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if got := q.Streams(0); len(got) != 4 || got[3] != "DELAYD_0S-P3" {
		t.Errorf("Streams(0) = %v, want DELAYD_0S-P0 to -P3", got)
	}
	if q.Router(6) != 2 || q.Ingress() != 4 || p.Ingress() != 1 || p.Count(0) != 1 {
		t.Errorf("Router(6) = %d, Ingress() = %d (%d without), Count(0) without = %d", q.Router(6), q.Ingress(), p.Ingress(), p.Count(0))
	}
	if q.String() != "1m=8" {
		t.Errorf("String() = %q, want the list as given", q.String())
	}
	bad, _ := ParsePartitions("1m=6")
	if err := bad.WithIngress(4).Check(tbl); !errors.Is(err, ErrBadPartitions) || !strings.Contains(err.Error(), "not a multiple") {
		t.Errorf("1m=6 with 4 ingress partitions: %v, want ErrBadPartitions saying not a multiple", err)
	}
}
