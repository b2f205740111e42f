//go:build long && gray && unix

package cluster

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The TIMELINE of a node fault: what the replicas logged from the fault to
// the next (or for twice the hang), by what it concerns, as times from the
// fault, so a stall beyond its bound can be put down to a cause: per
// level, up to the end of its longest delivery gap (the first delivery
// after it), its lease gained, lost or handed over, its scanner started,
// stopped or failing (with the error); the router's lease, restarts (with
// the error), syncs and failed writes, up to the last level's gap end; the
// replicas' connections; then how many of each other warning. Replicas log
// at debug in these tests ("lease gained", "scanner started" are debug
// records).

// timelineMax is how many entries a line of the TIMELINE shows at most
// (repeats of one record by one replica in a row count once).
const timelineMax = 24

// timelineKey are the records a level's or the router's line shows; the
// others (a bidder's "lease acquire failed", ...) are counted on the last
// line.
var timelineKey = []string{"lease gained", "lease lost", "lease handed over", "lease given up", "scanner start", "scanner step failed",
	"scanner stopped", "level stopped", "level stream", "router restarting", "router stopped", "every level stream synced",
	"deleted the ingress consumer", "level writes failed", "delivery failed", "connected to NATS", "disconnected from NATS"}

// isKey reports whether msg is one of timelineKey's records.
func isKey(msg string) bool {
	for _, k := range timelineKey {
		if strings.HasPrefix(msg, k) || strings.HasSuffix(msg, k) {
			return true
		}
	}
	return false
}

// timelineEntry is one log record, or a run of the same one by a replica.
type timelineEntry struct {
	off     time.Duration
	last    time.Duration // of a run
	replica string
	text    string
	n       int
}

// timeline returns the TIMELINE of the fault at at, up to end, with figs
// the fault's failover figures by level (clusterLevels' order).
func (h *hangTest) timeline(at, end time.Time, figs []failoverFigure) string {
	lines := map[string][]timelineEntry{}
	levelOf := map[string]string{} // level stream -> its line
	var order []string
	for _, lvl := range clusterLevels.Levels() {
		levelOf[lvl.Stream()] = lvl.Stream()
		order = append(order, lvl.Stream())
	}
	order = append(order, "router", "connections")
	stop := map[string]time.Duration{} // a line's last offset shown: its level's gap end; the router's, the last of them
	for i, f := range figs {
		stop[order[i]] = f.gapFrom + f.gap + 500*time.Millisecond
		stop["router"] = max(stop["router"], stop[order[i]])
	}
	others := map[string]int{}
	for _, r := range h.rs {
		for gen, lg := range r.logs {
			name := r.name
			if len(r.logs) > 1 {
				name = fmt.Sprintf("%s.%d", r.name, gen+1)
			}
			for _, e := range lg.events() {
				if e.logged.Before(at) || !e.logged.Before(end) {
					continue
				}
				line := timelineLine(e, levelOf)
				if line == "" || !isKey(e.msg) {
					if e.level == "WARN" || e.level == "ERROR" {
						others[e.msg]++
					}
					continue
				}
				if d, ok := stop[line]; ok && e.logged.Sub(at) > d {
					continue
				}
				text := e.msg
				for _, k := range []string{"epoch", "error", "cause", "url"} {
					if v := e.attr(k); v != "" {
						text += " " + k + "=" + clip(v, 160)
					}
				}
				lines[line] = append(lines[line], timelineEntry{off: e.logged.Sub(at), replica: name, text: text, n: 1})
			}
		}
	}
	var b strings.Builder
	for i, line := range order {
		es := lines[line]
		sort.SliceStable(es, func(a, b int) bool { return es[a].off < es[b].off })
		es = squash(es)
		fmt.Fprintf(&b, "\n  %s:", line)
		for k, e := range es {
			if k == timelineMax {
				fmt.Fprintf(&b, " … %d more", len(es)-k)
				break
			}
			n := ""
			if e.n > 1 {
				n = fmt.Sprintf(" (×%d, the last at %+.1fs)", e.n, e.last.Seconds())
			}
			fmt.Fprintf(&b, " %+.1fs %s %s%s;", e.off.Seconds(), e.replica, e.text, n)
		}
		if i < len(figs) {
			f := figs[i]
			fmt.Fprintf(&b, " longest gap %s from %+.1fs to %+.1fs (the first delivery after it)",
				f.gap.Round(time.Millisecond), f.gapFrom.Seconds(), (f.gapFrom + f.gap).Seconds())
		}
	}
	var counts []string
	for msg, n := range others {
		counts = append(counts, fmt.Sprintf("%s ×%d", msg, n))
	}
	sort.Strings(counts)
	fmt.Fprintf(&b, "\n  other warnings and errors (all replicas, the whole window): %s", strings.Join(counts, "; "))
	return b.String()
}

// timelineLine returns which TIMELINE line a record belongs to, "" for
// none: a level stream's (its lease, its scanner), the router's (its
// lease, its component), the connections' (connected, disconnected,
// reconnected), or any other warning or error.
func timelineLine(e logEvent, levelOf map[string]string) string {
	lease, stream := e.attr("lease"), e.attr("stream")
	switch {
	case strings.HasPrefix(lease, "level."):
		if l, ok := levelOf[strings.TrimPrefix(lease, "level.")]; ok {
			return l
		}
	case stream != "" && e.attr("component") == "scanner":
		if l, ok := levelOf[stream]; ok {
			return l
		}
	case lease == routerKey || e.attr("component") == "router":
		return "router"
	case strings.HasSuffix(e.msg, " to NATS") || strings.HasSuffix(e.msg, " from NATS"):
		return "connections"
	}
	return ""
}

// squash merges runs of one replica's same record into one entry.
func squash(es []timelineEntry) []timelineEntry {
	var out []timelineEntry
	for _, e := range es {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.replica == e.replica && last.text == e.text {
				last.n++
				last.last = e.off
				continue
			}
		}
		out = append(out, e)
	}
	return out
}

// clip shortens s to n bytes at most.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
