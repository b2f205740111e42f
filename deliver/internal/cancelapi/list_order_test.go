package cancelapi

import (
	"slices"
	"testing"
)

// TestListWalkOrder: a walk reads the level streams longest delay first
// (a cascading message only moves to shorter levels, so one that moves
// after its stream was read lands in one read later), partitions of a
// level by name, level 0 last; not in name order, where "DELAYD_10S"
// comes before "DELAYD_1H".
func TestListWalkOrder(t *testing.T) {
	t.Parallel()
	got := walkOrder([]string{"DELAYD_0S", "DELAYD_10S", "DELAYD_1H-P1", "DELAYD_1H-P0", "DELAYD_2M", "DELAYD_24H"})
	want := []string{"DELAYD_24H", "DELAYD_1H-P0", "DELAYD_1H-P1", "DELAYD_2M", "DELAYD_10S", "DELAYD_0S"}
	if !slices.Equal(got, want) {
		t.Fatalf("walk order %q, want %q", got, want)
	}
}
