package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Issue 13's targets (docs/benchmarks.md#targets): bounds on ratios and
// differences between rows of one run.
const (
	// BurstCoreTarget is the least burst-to-core msgs/s over ref-drain's.
	BurstCoreTarget = 0.7
	// BurstStreamTarget is the least burst-to-stream msgs/s over
	// ref-stream's.
	BurstStreamTarget = 0.8
	// IngestTarget is the least ingest msgs/s over ref-move's.
	IngestTarget = 0.85
	// Burst1MTarget is the most a burst of 1,000,000's last arrival after
	// due may be, over native schedules' in the same run.
	Burst1MTarget = 0.15
	// Burst1MN is the least size of a burst row (-burst-n) the burst-1m
	// target is read from when the burst-1m scenario did not run.
	Burst1MN = 1_000_000
	// SteadyP99OverTarget and SteadyMaxOverTarget are the most steady's
	// lateness p99 and max may exceed the timer floor's at the same rate,
	// in ms.
	SteadyP99OverTarget = 3.0
	SteadyMaxOverTarget = 15.0
	// SustainedTarget is the least sustained-max msgs/s over raw-publish's,
	// with lateness p99 at most SustainedP99Target ms.
	SustainedTarget    = 0.45
	SustainedP99Target = 50.0
	// CrossLevelP99Target is the most lateness p99 of level 1 while
	// another level takes a burst, in ms.
	CrossLevelP99Target = 50.0
)

// steadyTargetRates are the steady rates, msg/s, issue 13 sets a target at.
var steadyTargetRates = []int{10_000, 30_000}

// Status of a target in a run.
const (
	StatusMet    = "met"
	StatusNotMet = "not met"
	StatusNotRun = "not run" // the rows it is read from are not in the run
)

// goal is one of issue 13's targets, evaluated from the rows of one run.
type goal struct {
	// ID names the target: burst-core, burst-stream, ingest, burst-1m-core,
	// burst-1m-stream, steady-10k, steady-30k, sustained, cross-level,
	// lost-early.
	ID string `json:"issue_target"`
	// Goal is the bound, as issue 13 states it.
	Goal string `json:"goal"`
	// Figure is this run's figures the bound is checked on, or why the
	// target was not run.
	Figure string `json:"figure"`
	// Ratio is the figure compared with a ratio bound (burst, ingest,
	// burst-1m, sustained).
	Ratio *float64 `json:"ratio,omitempty"`
	// P99Ms is the lateness p99 compared with a bound, in ms (sustained,
	// cross-level).
	P99Ms *float64 `json:"p99_ms,omitempty"`
	// OverP99Ms and OverMaxMs are lateness p99 and max minus the timer
	// floor's at the same rate, in ms (steady).
	OverP99Ms *float64 `json:"over_p99_ms,omitempty"`
	OverMaxMs *float64 `json:"over_max_ms,omitempty"`
	// Status is StatusMet, StatusNotMet or StatusNotRun.
	Status    string `json:"status"`
	Transport string `json:"transport,omitempty"`
}

// findRow is the first row of rows with the scenario, system and target,
// and the rate if rate > 0; nil if none.
func findRow(rows []result, scenario, system, target string, rate int) *result {
	for i := range rows {
		r := &rows[i]
		if r.Scenario == scenario && r.System == system && r.Target == target && (rate == 0 || r.Rate == rate) {
			return r
		}
	}
	return nil
}

// clean says whether none of the rows lost a message or delivered one
// early, and if some did, what (for the figure).
func clean(rows ...*result) (bool, string) {
	var bad []string
	for _, r := range rows {
		if r.Lost != 0 || r.Early != 0 {
			bad = append(bad, fmt.Sprintf("%s/%s/%s lost %d, early %d", r.Scenario, r.System, r.Target, r.Lost, r.Early))
		}
	}
	return len(bad) == 0, strings.Join(bad, "; ")
}

// status is StatusMet if ok and every row is clean, else StatusNotMet;
// figure gets the rows' losses and early deliveries.
func status(ok bool, figure *string, rows ...*result) string {
	c, why := clean(rows...)
	if !c {
		*figure += " (" + why + ")"
	}
	if ok && c {
		return StatusMet
	}
	return StatusNotMet
}

// evaluate reads issue 13's targets from rows, the rows of one run (with
// their Rate, Lateness and MsgsPerS as written): each target with its
// figure, ratio and status. A target whose rows are missing, or whose
// rows have no figure (no msgs/s, no lateness), is StatusNotRun, resp.
// StatusNotMet. A target is met only if its rows also lost nothing and
// delivered nothing early.
func evaluate(rows []result) []goal {
	var out []goal
	ratio := func(id, goalText, scenario, target, refScenario string, bound float64) {
		g := goal{ID: id, Goal: goalText}
		r := findRow(rows, scenario, "delayd", target, 0)
		ref := findRow(rows, refScenario, "raw", target, 0)
		switch {
		case r == nil || ref == nil:
			g.Status, g.Figure = StatusNotRun, notRun(scenario, r, refScenario, ref)
		case r.MsgsPerS <= 0 || ref.MsgsPerS <= 0:
			g.Figure = fmt.Sprintf("%s %.0f msg/s, %s %.0f msg/s: no rate", scenario, r.MsgsPerS, refScenario, ref.MsgsPerS)
			g.Status = status(false, &g.Figure, r, ref)
		default:
			v := r.MsgsPerS / ref.MsgsPerS
			g.Ratio = &v
			g.Figure = fmt.Sprintf("%.0f / %.0f msg/s = %.2f× %s", r.MsgsPerS, ref.MsgsPerS, v, refScenario)
			g.Status = status(v >= bound, &g.Figure, r, ref)
		}
		out = append(out, g)
	}
	ratio("burst-core", fmt.Sprintf("burst to core ≥ %.2g× drain ceiling (ref-drain)", BurstCoreTarget), "burst", "core", "ref-drain", BurstCoreTarget)
	ratio("burst-stream", fmt.Sprintf("burst to a stream-bound target ≥ %.2g× stream-bound ceiling (ref-stream)", BurstStreamTarget), "burst", "stream", "ref-stream", BurstStreamTarget)
	ratio("ingest", fmt.Sprintf("ingest ≥ %.2g× move ceiling (ref-move)", IngestTarget), "ingest", "stream", "ref-move", IngestTarget)

	// The burst of 1M: burst-1m's rows (of any -burst-1m-n: the figure
	// gives n), or burst's if -burst-n was a million or more.
	burst1M := func(target string) (r, native *result) {
		if r = findRow(rows, "burst-1m", "delayd", target, 0); r != nil {
			return r, findRow(rows, "burst-1m", "native", "stream", 0)
		}
		if r = findRow(rows, "burst", "delayd", target, 0); r != nil && r.N >= Burst1MN {
			return r, findRow(rows, "burst", "native", "stream", 0)
		}
		return nil, nil
	}
	for _, target := range []string{"core", "stream"} {
		g := goal{ID: "burst-1m-" + target, Goal: fmt.Sprintf("burst of 1M to %s: last delivered after due ≤ %.2g× native's", target, Burst1MTarget)}
		r, native := burst1M(target)
		switch {
		case r == nil || native == nil:
			g.Status, g.Figure = StatusNotRun, "no burst-1m rows (delayd "+target+" and native), nor burst rows of 1,000,000 or more"
		case r.Lateness == nil || native.Lateness == nil || native.Lateness.Max <= 0:
			g.Figure = "no lateness in the delayd or native row"
			g.Status = status(false, &g.Figure, r, native)
		default:
			v := r.Lateness.Max / native.Lateness.Max
			g.Ratio = &v
			g.Figure = fmt.Sprintf("%d messages: last %.2f s after due / native %.2f s = %.2f×", r.N, r.Lateness.Max/1000, native.Lateness.Max/1000, v)
			g.Status = status(v <= Burst1MTarget, &g.Figure, r, native)
		}
		out = append(out, g)
	}

	for _, rate := range steadyTargetRates {
		g := goal{ID: "steady-" + strings.TrimSuffix(rateLabel(rate), "/s"),
			Goal: fmt.Sprintf("steady %s: lateness p99 ≤ timer floor p99 + %.0f ms, max ≤ floor max + %.0f ms", rateLabel(rate), SteadyP99OverTarget, SteadyMaxOverTarget)}
		r, floor := findRow(rows, "steady", "delayd", "core", rate), findRow(rows, "ref-timer", "raw", "core", rate)
		switch {
		case r == nil || floor == nil:
			g.Status, g.Figure = StatusNotRun, notRun("steady "+rateLabel(rate), r, "ref-timer "+rateLabel(rate), floor)
		case r.Lateness == nil || floor.Lateness == nil:
			g.Figure = "no lateness in the steady or ref-timer row"
			g.Status = status(false, &g.Figure, r, floor)
		default:
			p99, mx := r.Lateness.P99-floor.Lateness.P99, r.Lateness.Max-floor.Lateness.Max
			g.OverP99Ms, g.OverMaxMs = &p99, &mx
			g.Figure = fmt.Sprintf("p99 %.1f ms (floor %.1f, %+.1f), max %.1f ms (floor %.1f, %+.1f)",
				r.Lateness.P99, floor.Lateness.P99, p99, r.Lateness.Max, floor.Lateness.Max, mx)
			g.Status = status(p99 <= SteadyP99OverTarget && mx <= SteadyMaxOverTarget, &g.Figure, r, floor)
		}
		out = append(out, g)
	}

	{
		g := goal{ID: "sustained", Goal: fmt.Sprintf("sustained ≥ %.2g× raw publish, lateness p99 ≤ %.0f ms", SustainedTarget, SustainedP99Target)}
		r, raw := findRow(rows, "sustained-max", "delayd", "core", 0), findRow(rows, "raw-publish", "raw", "stream", 0)
		switch {
		case r == nil || raw == nil:
			g.Status, g.Figure = StatusNotRun, notRun("sustained-max", r, "raw-publish", raw)
		case r.MsgsPerS <= 0 || r.Lateness == nil || raw.MsgsPerS <= 0:
			g.Figure = "no step bounded"
			g.Status = status(false, &g.Figure, r, raw)
		default:
			v := r.MsgsPerS / raw.MsgsPerS
			g.Ratio, g.P99Ms = &v, &r.Lateness.P99
			g.Figure = fmt.Sprintf("%.0f / %.0f msg/s = %.2f× raw-publish, p99 %.1f ms", r.MsgsPerS, raw.MsgsPerS, v, r.Lateness.P99)
			g.Status = status(v >= SustainedTarget && r.Lateness.P99 <= SustainedP99Target, &g.Figure, r, raw)
		}
		out = append(out, g)
	}

	{
		g := goal{ID: "cross-level", Goal: fmt.Sprintf("another level's lateness p99 ≤ %.0f ms while one level takes a burst", CrossLevelP99Target)}
		r, quiet := findRow(rows, "cross-level-burst", "delayd", "core", 0), findRow(rows, "cross-level-quiet", "delayd", "core", 0)
		switch {
		case r == nil:
			g.Status, g.Figure = StatusNotRun, "no cross-level-burst row"
		case r.Lateness == nil:
			g.Figure = "no lateness in the cross-level-burst row"
			g.Status = status(false, &g.Figure, r)
		default:
			g.P99Ms = &r.Lateness.P99
			g.Figure = fmt.Sprintf("p99 %.1f ms during the burst", r.Lateness.P99)
			if quiet != nil && quiet.Lateness != nil {
				g.Figure += fmt.Sprintf(" (%.1f ms alone)", quiet.Lateness.P99)
			}
			g.Status = status(r.Lateness.P99 <= CrossLevelP99Target, &g.Figure, r)
		}
		out = append(out, g)
	}

	{
		g := goal{ID: "lost-early", Goal: "every row: lost 0, early 0"}
		all := make([]*result, 0, len(rows))
		for i := range rows {
			all = append(all, &rows[i])
		}
		if len(all) == 0 {
			g.Status, g.Figure = StatusNotRun, "no rows"
		} else {
			g.Figure = fmt.Sprintf("%d rows", len(all))
			g.Status = status(true, &g.Figure, all...)
		}
		out = append(out, g)
	}
	return out
}

// notRun names the rows a target is read from that are not in the run.
func notRun(name string, r *result, refName string, ref *result) string {
	var missing []string
	if r == nil {
		missing = append(missing, name)
	}
	if ref == nil {
		missing = append(missing, refName)
	}
	return "no " + strings.Join(missing, " or ") + " row"
}

// targets writes issue 13's targets evaluated from the rows written so far:
// a Markdown table (target, this run, status), or with -json one object
// per target.
func (o *output) targets() {
	goals := evaluate(o.rows)
	if o.cfg.JSON {
		for _, g := range goals {
			if o.cfg.TCP {
				g.Transport = "tcp"
			}
			b, _ := json.Marshal(g)
			fmt.Fprintln(o.w, string(b))
		}
		return
	}
	how := "in-process"
	if o.cfg.TCP {
		how = "over TCP"
	}
	fmt.Fprintf(o.w, "\nissue 13's targets, from this run's rows (%s):\n\n", how)
	fmt.Fprintln(o.w, "| target | this run | status |")
	fmt.Fprintln(o.w, "|---|---|---|")
	for _, g := range goals {
		fmt.Fprintf(o.w, "| %s | %s | %s |\n", g.Goal, g.Figure, g.Status)
	}
	fmt.Fprintln(o.w)
}
