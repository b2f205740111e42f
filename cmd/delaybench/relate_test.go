package main

import (
	"io"
	"testing"
)

// TestRelateRefs: a row compared with a reference measured earlier gets
// ref_ratio = its msgs/s over the reference's (a throughput reference) or
// over_ref_ms = its lateness minus the reference's (a lateness reference),
// and raw_ratio = its msgs/s over raw-publish's; a row whose reference did
// not run gets none. (TestSmoke checks only that they are present and
// positive.)
func TestRelateRefs(t *testing.T) {
	o := newOutput(config{}, io.Discard)
	early := result{Scenario: "burst", System: "delayd", Target: "stream", MsgsPerS: 300}
	o.relate(&early) // ref-stream has not run
	if early.Ref != "" || early.RefRatio != nil || early.RawRatio != nil {
		t.Errorf("row before its reference and raw-publish: ref %q ratio %v raw %v, want none", early.Ref, early.RefRatio, early.RawRatio)
	}
	for _, r := range []result{
		{Scenario: "raw-publish", System: "raw", Target: "stream", MsgsPerS: 1000},
		{Scenario: "ref-drain", System: "raw", Target: "core", MsgsPerS: 500},
		{Scenario: "ref-timer", System: "raw", Target: "core", Lateness: &lateness{P50: 1, P99: 2, Max: 3}},
	} {
		o.relate(&r)
	}
	burst := result{Scenario: "burst", System: "delayd", Target: "core", MsgsPerS: 250}
	o.relate(&burst)
	if burst.Ref != "ref-drain" || burst.RefRatio == nil || *burst.RefRatio != 0.5 || burst.RawRatio == nil || *burst.RawRatio != 0.25 {
		t.Errorf("burst core at 250/s, ref-drain 500/s, raw 1000/s: ref %q ratio %v raw %v, want ref-drain 0.5 and 0.25", burst.Ref, deref(burst.RefRatio), deref(burst.RawRatio))
	}
	steady := result{Scenario: "steady", System: "delayd", Target: "core", MsgsPerS: 100, Lateness: &lateness{P50: 5, P99: 7, Max: 11}}
	o.relate(&steady)
	if steady.Ref != "ref-timer" || steady.OverRef == nil || *steady.OverRef != (lateness{P50: 4, P99: 5, Max: 8}) || steady.RefRatio != nil || steady.RawRatio != nil {
		t.Errorf("steady core: ref %q over_ref %+v ratio %v raw %v, want ref-timer {4 5 8}, no ratios", steady.Ref, steady.OverRef, steady.RefRatio, steady.RawRatio)
	}
}

// TestRelateRefsByRate: with several steady rates, each steady row is
// compared with the timer floor at its own rate (ref-timer 10k/s measured
// first, then 30k/s), and each floor is remembered under its rate.
func TestRelateRefsByRate(t *testing.T) {
	o := newOutput(config{}, io.Discard)
	for _, r := range []result{
		{Scenario: "ref-timer", System: "raw", Target: "core", Rate: 10_000, Lateness: &lateness{P50: 1, P99: 2, Max: 3}},
		{Scenario: "ref-timer", System: "raw", Target: "core", Rate: 30_000, Lateness: &lateness{P50: 2, P99: 6, Max: 20}},
	} {
		o.relate(&r)
	}
	for _, c := range []struct {
		rate int
		want lateness
	}{{10_000, lateness{P50: 4, P99: 8, Max: 27}}, {30_000, lateness{P50: 3, P99: 4, Max: 10}}} {
		r := result{Scenario: "steady", System: "delayd", Target: "core", Rate: c.rate, Lateness: &lateness{P50: 5, P99: 10, Max: 30}}
		o.relate(&r)
		if r.Ref != "ref-timer" || r.OverRef == nil || *r.OverRef != c.want {
			t.Errorf("steady %d/s: ref %q over_ref %+v, want ref-timer %+v (the floor at its rate)", c.rate, r.Ref, r.OverRef, c.want)
		}
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
