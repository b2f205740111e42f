package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Sustained end to end: the bound a step's lateness and delivery must keep.
const (
	// sustainedP99 is the highest lateness p99 of a bounded step.
	sustainedP99 = 50 * time.Millisecond
	// sustainedShare is the least share of the offered rate a bounded step
	// must publish, and of the published rate it must deliver.
	sustainedShare = 0.95
)

// sustained offers each of -sustained-rates msg/s in turn, for
// -sustained-step each, to the level "1s" with a core target, on one
// fresh server and service warmed up by 2 s at the first rate (not
// counted), each step once the previous one is delivered, until a step is
// not bounded: its lateness
// p99 above 50 ms, a message lost, the publisher reaching less than 95% of
// the rate offered, or deliveries (distinct / (last − first arrival))
// less than 95% of the rate published. One "sustained" row per step, then
// a "sustained-max" row whose msgs_per_s is the highest bounded step's
// published rate (raw_ratio: over raw-publish's, which this scenario
// measures itself when the raw scenario did not run).
func (b *bench) sustained(ctx context.Context) ([]result, []string, error) {
	var rows []result
	if !b.cfg.wants("raw") {
		raw, _, err := b.raw(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("raw: %w", err)
		}
		rows = append(rows, raw[0])
	}
	e, err := b.newEnv()
	if err != nil {
		return rows, nil, err
	}
	defer e.close()
	svc, err := e.startService(ctx, "1s")
	if err != nil {
		return rows, nil, err
	}
	defer func() { _ = svc.stop() }()
	warm := b.cfg.SustainedRates[0]
	if _, _, err := b.sustainedStep(ctx, e, "sustained.warmup", warm, 2*warm); err != nil {
		return rows, nil, fmt.Errorf("warm-up: %w", err)
	}
	best := result{Scenario: "sustained-max", System: "delayd", Target: "core"}
	for step, rate := range b.cfg.SustainedRates {
		total := int(float64(rate) * b.cfg.SustainedStep.Seconds())
		r, bounded, err := b.sustainedStep(ctx, e, fmt.Sprintf("sustained.s%d", step), rate, total)
		rows = append(rows, r)
		if err != nil {
			return rows, nil, err
		}
		if !bounded {
			break
		}
		best.N, best.MsgsPerS, best.Lateness = r.N, r.MsgsPerS, r.Lateness
		best.Note = fmt.Sprintf("offered %d msg/s", rate)
	}
	if best.N == 0 {
		best.Note = "no step bounded"
	}
	return append(rows, best), nil, nil
}

// sustainedStep publishes total messages at rate msg/s to the running
// service for target, waits for their delivery, and says whether the step
// stayed bounded.
func (b *bench) sustainedStep(ctx context.Context, e *env, target string, rate, total int) (result, bool, error) {
	row := result{Scenario: "sustained", System: "delayd", Target: "core"}
	label := fmt.Sprintf("sustained %d/s", rate)
	core, err := e.subscribe(target, total)
	if err != nil {
		return row, false, err
	}
	defer func() { _ = core.sub.Unsubscribe() }()
	p, err := b.publishRate(ctx, e, label, rate, total, nil, nil, func(i int) *nats.Msg { return b.delaydMsg(i, target, 1) })
	if err != nil {
		return row, false, err
	}
	b.waitCount(ctx, label+": delivered", p.sent, 2*time.Minute, core.count)
	t := count(core.arrivals(), p.sent, func(a arrival) time.Time { return a.due })
	row.N, row.MsgsPerS = p.sent, float64(p.sent)/p.elapsed.Seconds()
	row.Lost, row.Early, row.Lateness = t.lost, t.early, t.lateness
	var delivered float64
	if span := t.last.Sub(t.first).Seconds(); t.distinct > 1 && span > 0 {
		delivered = float64(t.distinct-1) / span
	}
	row.DeliveredPerS = delivered
	var why []string
	if row.MsgsPerS < sustainedShare*float64(rate) {
		why = append(why, fmt.Sprintf("published %.0f of %d msg/s offered", row.MsgsPerS, rate))
	}
	if delivered < sustainedShare*row.MsgsPerS {
		why = append(why, fmt.Sprintf("delivered %.0f msg/s", delivered))
	}
	if t.lateness == nil || t.lateness.P99 > float64(sustainedP99.Milliseconds()) {
		why = append(why, fmt.Sprintf("lateness p99 above %s", sustainedP99))
	}
	if t.lost > 0 || t.early > 0 {
		why = append(why, "lost or early messages")
	}
	bounded := len(why) == 0
	row.Note = fmt.Sprintf("offered %d msg/s, delivered %.0f msg/s: bounded", rate, delivered)
	if !bounded {
		row.Note = fmt.Sprintf("offered %d msg/s: not bounded (%s)", rate, notes(why...))
	}
	row.Note = notes(row.Note, refusedNote(p.sent, p.sent-p.refused), dupNote(t.dups))
	return row, bounded, nil
}
