package console

import (
	"html/template"
	"time"

	"github.com/delayd/delayd/levels"
)

// histogramBars is the number of bars of a due-time histogram.
const histogramBars = 24

// histogram counts due times in equal spans from the first to the last, drawn as inline SVG bars by target.html.
type histogram struct {
	From, To time.Time
	Span     time.Duration
	Bars     []bar
	Counted  int // due times counted
	Total    int // messages pending for the target (the list API's total)
	Max      int // the highest bar's count
}

// bar is one span of a histogram, with its SVG geometry (a 600x120 view box).
type bar struct {
	From       time.Time
	Count      int
	X, Y, W, H float64
}

func newHistogram(dues []time.Time, total int) *histogram {
	h := &histogram{Counted: len(dues), Total: total}
	if len(dues) == 0 {
		return h
	}
	h.From, h.To = dues[0], dues[0]
	for _, d := range dues {
		h.From, h.To = minTime(h.From, d), maxTime(h.To, d)
	}
	h.Span = max(h.To.Sub(h.From)/histogramBars+1, time.Millisecond)
	counts := make([]int, histogramBars)
	for _, d := range dues {
		counts[min(int(d.Sub(h.From)/h.Span), histogramBars-1)]++
	}
	for _, n := range counts {
		h.Max = max(h.Max, n)
	}
	const width, height = 600.0, 120.0
	w := width / histogramBars
	for i, n := range counts {
		bh := height * float64(n) / float64(h.Max)
		h.Bars = append(h.Bars, bar{From: h.From.Add(time.Duration(i) * h.Span), Count: n, X: float64(i) * w, Y: height - bh, W: w - 2, H: bh})
	}
	return h
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// funcs are the templates' helpers; none returns template.HTML or another trusted type.
var funcs = template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"in": func(now, t time.Time) string {
		if t.IsZero() {
			return ""
		}
		d := t.Sub(now).Round(time.Second)
		if d < 0 {
			return "overdue " + (-d).String()
		}
		return "in " + d.String()
	},
	"delay":    levels.FormatDuration,
	"duration": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"f1":       func(f float64) float64 { return float64(int(f*10)) / 10 },
}
