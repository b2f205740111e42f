package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/metrics"
)

// dashboard is deploy/grafana/delayd.json, as far as the checks read it.
type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Datasource *datasource     `json:"datasource"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		Expr       string      `json:"expr"`
		Format     string      `json:"format"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana/delayd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana/delayd.json: %v", err)
	}
	return d
}

var (
	promqlString   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\[\]]*\]`)
	grafanaVar     = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// A number (with a duration unit, as after offset) or an identifier.
	promqlToken     = regexp.MustCompile(`[0-9][0-9.]*(?:[eE][+-]?[0-9]+)?[a-zA-Z]*|[a-zA-Z_:][a-zA-Z0-9_:]*`)
	labelValuesCall = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*)\s*,\s*)?[a-zA-Z_]\w*\s*\)\s*$`)
)

// promqlKeywords are PromQL's operators and keywords spelled as identifiers.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true, "on": true,
	"ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "atan2": true,
}

// metricNames returns the metric names a PromQL expression selects: every identifier that is not a function (one
// followed by "("), a keyword, a label (in {…} matchers or a by/without/on/ignoring/group_… list), a range or a
// Grafana variable.
func metricNames(expr string) []string {
	e := promqlString.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, " ")
	e = promqlRange.ReplaceAllString(e, " ")
	e = grafanaVar.ReplaceAllString(e, " ")
	e = promqlGrouping.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promqlToken.FindAllStringIndex(e, -1) {
		tok := e[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || promqlKeywords[strings.ToLower(tok)] {
			continue
		}
		if rest := strings.TrimLeft(e[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or aggregation
		}
		names = append(names, tok)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum(delayd_ready)`, []string{"delayd_ready"}},
		{`histogram_quantile(0.99, sum by (le, delay) (rate(delayd_delivery_lateness_seconds_bucket{delay=~"$delay"}[$__rate_interval])))`,
			[]string{"delayd_delivery_lateness_seconds_bucket"}},
		{`sum without (instance) (a_total) / on (job) group_left (x) b offset 5m > 1e-3 and bool c{l="by (x)"}`, []string{"a_total", "b", "c"}},
		{`rate(process_cpu_seconds_total{job=~"${job}"}[5m:1m])`, []string{"process_cpu_seconds_total"}},
		{`max by (delay) (x) unless y`, []string{"x", "y"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// exportedMetrics returns the names delayd's /metrics serves, each with the label names of its series: it runs a
// real Service against an embedded nats-server, delivers one message (so that the lateness histogram has a series),
// scrapes the collector's Handler, the one delayd serves, and adds every metric the collector describes (some, such
// as dead letters by reason, have no series until they happen: their labels are the description's variable labels).
// A histogram's name stands for its _bucket (with le), _sum and _count series.
func exportedMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	srv := natstest.Start(t, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var m *metrics.Metrics
	svc, err := deliver.New(nc, deliver.Config{
		Levels:     levels.MustParse("100ms"),
		OnDelivery: func(stream string, lateness time.Duration) { m.ObserveDelivery(stream, lateness) },
	})
	if err != nil {
		t.Fatal(err)
	}
	m = metrics.New(svc, nc)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })

	sub, err := nc.SubscribeSync("deploytest.target")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !svc.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("service not ready: %v", svc.Unready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	msg := nats.NewMsg(contract.PrefixDefault + ".deploytest.target")
	msg.Header.Set(contract.HeaderLevel, "1")
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("the delayed message was not delivered: %v", err)
	}

	hs := httptest.NewServer(m.Handler())
	t.Cleanup(hs.Close)
	resp, err := hs.Client().Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	names := map[string]map[string]bool{}
	add := func(name string, labels ...string) {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		for _, l := range labels {
			names[name][l] = true
		}
	}
	for name, f := range families {
		var labels []string
		for _, s := range f.GetMetric() {
			for _, lp := range s.GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		add(name, labels...)
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			add(name+"_bucket", append(labels, "le")...)
			add(name+"_sum", labels...)
			add(name+"_count", labels...)
		case dto.MetricType_SUMMARY:
			add(name, "quantile")
			add(name+"_sum", labels...)
			add(name+"_count", labels...)
		}
	}
	if names["delayd_delivery_lateness_seconds_bucket"] == nil {
		t.Fatal("/metrics has no lateness histogram after a delivery")
	}
	descs := make(chan *prometheus.Desc)
	go func() { m.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	varLabels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	for d := range descs {
		sm := fqName.FindStringSubmatch(d.String())
		if sm == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		if _, scraped := families[sm[1]]; scraped {
			continue // its series' labels are known
		}
		vl := varLabels.FindStringSubmatch(d.String())
		if vl == nil {
			t.Fatalf("cannot read the variable labels of %s", d)
		}
		var labels []string
		for _, l := range strings.Split(vl[1], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				labels = append(labels, l)
			}
		}
		add(sm[1], labels...)
	}
	return names
}

var (
	promqlMatcherLabel = regexp.MustCompile(`([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)`)
	promqlLabelList    = regexp.MustCompile(`\(([^()]*)\)`)
	labelValuesLabel   = regexp.MustCompile(`,\s*([a-zA-Z_]\w*)\s*\)\s*$`)
)

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = map[string]bool{"job": true, "instance": true}

// labelNames returns the label names a PromQL expression uses: in {…} matchers and in by/without/on/ignoring/group_…
// lists.
func labelNames(expr string) []string {
	e := promqlString.ReplaceAllString(expr, `""`)
	var out []string
	for _, m := range promqlMatchers.FindAllString(e, -1) {
		for _, sm := range promqlMatcherLabel.FindAllStringSubmatch(m, -1) {
			out = append(out, sm[1])
		}
	}
	for _, g := range promqlGrouping.FindAllString(e, -1) {
		list := promqlLabelList.FindStringSubmatch(g)
		for _, l := range strings.Split(list[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

func TestLabelNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum(delayd_ready)`, nil},
		{`histogram_quantile(0.99, sum by (le, delay) (rate(delayd_delivery_lateness_seconds_bucket{delay=~"$delay"}[$__rate_interval])))`,
			[]string{"delay", "le", "delay"}},
		{`sum without (instance) (a{x!="by (y)", z!~'w'}) / on (job) group_left (k) b`, []string{"x", "z", "instance", "job", "k"}},
	} {
		if got := labelNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("labelNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestDashboardMetricsExported: every metric any query of deploy/grafana/delayd.json names (panels and template
// variables) is one delayd's /metrics serves, and every label it names (by (delay), {delay=~"$delay"}, le, stream,
// reason, lease, result, label_values' label) is a label of that metric's series, or job or instance. A query naming
// another metric or label shows "No data" (or one unlabelled line) for ever in Grafana; this catches a misspelling, or
// a metric or label renamed in metrics/ but not in the dashboard.
func TestDashboardMetricsExported(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	type query struct{ where, expr, label string } // label: label_values' label
	var queries []query
	for _, p := range allPanels(d.Panels) {
		for i, tg := range p.Targets {
			queries = append(queries, query{fmt.Sprintf("panel %d %q target %d", p.ID, p.Title, i), tg.Expr, ""})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query is neither an object nor a string: %s", v.Name, v.Query)
			}
		}
		expr, label := q.Query, ""
		if sm := labelValuesCall.FindStringSubmatch(expr); sm != nil {
			expr = sm[1] // label_values(selector, label): the label is no metric
			if lm := labelValuesLabel.FindStringSubmatch(q.Query); lm != nil {
				label = lm[1]
			}
		}
		queries = append(queries, query{"variable " + v.Name, expr, label})
	}
	if len(queries) < 10 {
		t.Fatalf("found %d queries in the dashboard: the parse no longer finds them", len(queries))
	}

	exported := exportedMetrics(t)
	used := map[string]bool{}
	for _, q := range queries {
		if strings.TrimSpace(q.expr) == "" {
			t.Errorf("%s: empty query", q.where)
		}
		// The labels the query names are the series' labels of a metric it selects (a target label excepted): a
		// label the collectors do not set groups or matches nothing.
		have := map[string]bool{}
		for _, name := range metricNames(q.expr) {
			used[name] = true
			if exported[name] == nil {
				t.Errorf("%s names %s, which delayd does not export: %s", q.where, name, q.expr)
			}
			for l := range exported[name] {
				have[l] = true
			}
		}
		labels := labelNames(q.expr)
		if q.label != "" {
			labels = append(labels, q.label)
		}
		slices.Sort(labels)
		for _, l := range slices.Compact(labels) {
			if !have[l] && !targetLabels[l] && l != "__name__" {
				t.Errorf("%s uses the label %s, which no series of %v has (%v): %s", q.where, l, metricNames(q.expr), have, q.expr)
			}
		}
	}
	// Each topic the dashboard is for has a panel.
	for _, want := range []string{
		"delayd_delivery_lateness_seconds_bucket", "delayd_level_pending_messages", "delayd_level_oldest_due_age_seconds",
		"delayd_routed_total", "delayd_dead_lettered_total", "delayd_lease_held", "delayd_failovers_total",
		"delayd_fenced_writes_total",
	} {
		if !used[want] {
			t.Errorf("no query of the dashboard uses %s", want)
		}
	}
	var unused []string
	for name := range exported {
		if strings.HasPrefix(name, "delayd_") && !used[name] && !used[name+"_bucket"] && !strings.HasPrefix(name, "delayd_delivery_lateness_seconds_") {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	t.Logf("delayd metrics the dashboard does not show: %v", unused)
}

// TestDashboardShape: the dashboard imports with a Prometheus data source chosen at import (${DS_PROMETHEUS}), its
// panel ids are unique, every variable a query uses is defined, and lateness is a heatmap of the histogram's buckets.
func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs = %+v, want one prometheus datasource input DS_PROMETHEUS", d.Inputs)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d: want a current one (39 or later, Grafana 11+)", d.SchemaVersion)
	}
	if d.UID == "" {
		t.Error("no uid: links to the dashboard would change at every import")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${DS_PROMETHEUS}") {
			t.Errorf("variable %s: datasource %+v, want uid ${DS_PROMETHEUS}", v.Name, v.Datasource)
		}
	}
	ids := map[int]string{}
	heatmap := false
	for _, p := range allPanels(d.Panels) {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: datasource %+v, want uid ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			for _, ref := range grafanaVar.FindAllString(tg.Expr, -1) {
				if name := strings.Trim(ref, "${}"); !vars[name] {
					t.Errorf("panel %q uses $%s, which is no variable of the dashboard", p.Title, name)
				}
			}
			if p.Type == "heatmap" && tg.Format == "heatmap" && strings.Contains(tg.Expr, "delayd_delivery_lateness_seconds_bucket") {
				heatmap = true
			}
		}
	}
	if !heatmap {
		t.Error("no heatmap panel of delayd_delivery_lateness_seconds_bucket with format heatmap")
	}
}
