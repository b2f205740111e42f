package main

import (
	"testing"
	"time"
)

// TestCount: the tally the benchmark's "lost 0, early 0" checks rest on.
// Of messages 0..4: 0 on time, 1 early (before its due), 2 twice (a
// duplicate), 3 never (lost), 4 on time, and an index out of range
// ignored. Lateness is arrival minus the base; first and last are the
// earliest and latest counted arrivals.
func TestCount(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	arrs := []arrival{
		{idx: 0, at: at(110), due: at(100)},
		{idx: 1, at: at(90), due: at(100)},
		{idx: 2, at: at(120), due: at(100)},
		{idx: 2, at: at(130), due: at(100)},
		{idx: 4, at: at(140), due: at(100)},
		{idx: 7, at: at(10), due: at(100)},
	}
	got := count(arrs, 5, func(a arrival) time.Time { return a.due })
	if got.distinct != 4 || got.dups != 1 || got.early != 1 || got.lost != 1 {
		t.Errorf("distinct %d dups %d early %d lost %d; want 4, 1, 1, 1", got.distinct, got.dups, got.early, got.lost)
	}
	if got.lateness == nil || got.lateness.Max != 40 || got.lateness.P50 != 10 {
		t.Errorf("lateness %+v; want p50 10 ms, max 40 ms (arrivals -10, 10, 20, 40 ms after due)", got.lateness)
	}
	if !got.first.Equal(at(90)) || !got.last.Equal(at(140)) {
		t.Errorf("first %v last %v; want +90 ms and +140 ms", got.first.Sub(t0), got.last.Sub(t0))
	}
}
