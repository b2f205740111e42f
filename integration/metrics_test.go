package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/metrics"
)

// TestMetrics scrapes /metrics after known traffic, parses it with the
// Prometheus text parser, and checks the counters.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	var m atomic.Pointer[metrics.Metrics]
	b.StartDelayd("100ms 1h", func(c *deliver.Config) {
		c.OnDelivery = func(stream string, l time.Duration) {
			if mm := m.Load(); mm != nil {
				mm.ObserveDelivery(stream, l)
			}
		}
	})
	m.Store(metrics.New(b.Svc, b.NC))
	srv := httptest.NewServer(m.Load().Handler())
	t.Cleanup(srv.Close)

	c := b.Collect("met.>")
	var now []uint64
	for i := range 5 {
		now = append(now, b.Publish("delay.met.x", []byte(strconv.Itoa(i)), itest.Level(1)))
	}
	var later []uint64
	for range 3 {
		later = append(later, b.Publish("delay.met.later", []byte("x"), itest.Level(2))) // pending for an hour
	}
	for range 3 { // one routed, two merged into it
		hdr := itest.Level(2)
		hdr.Set(contract.HeaderMergeKey, "k")
		b.Publish("delay.met.merge", []byte("m"), hdr)
	}
	if r := b.Cancel(strconv.FormatUint(later[0], 10)); r != "cancelled" {
		t.Fatalf("cancel: %q", r)
	}
	if r := b.Cancel("nope"); r != "not found" {
		t.Fatalf("cancel nope: %q", r)
	}
	b.Publish("delay.met.bad", nil, itest.Level(-1))
	b.Publish("delay.met.bad", nil, nil)
	b.Publish("delay.$JS.API.INFO", nil, itest.Level(1))
	c.Wait(t, 5, 10*time.Second)
	// Status requests, one of each state, counted apart from the cancels.
	for id, want := range map[uint64]delayd.State{later[0]: delayd.StateCancelled, later[1]: delayd.Pending, now[0]: delayd.StateDelivered, 1 << 40: delayd.StateNotFound} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		r, err := delayd.StatusAny(ctx, b.NC, strconv.FormatUint(id, 10))
		cancel()
		if err != nil || r.State != want {
			t.Fatalf("status %d: %+v, %v; want %q", id, r, err, want)
		}
	}
	// A list, a refused list and a cancel-all (of a target with nothing pending), counted by result.
	{
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if page, err := delayd.ListPending(ctx, b.NC, "met.later"); err != nil || len(page.Items) != 2 {
			t.Fatalf("list met.later: %+v %v, want its two pending", page, err)
		}
		if m, err := b.NC.RequestWithContext(ctx, delayd.PendingSubjectFor("met.later"), []byte(`{"limit":5000}`)); err != nil || m.Header.Get(delayd.HeaderStatus) != "400" {
			t.Fatalf("list with limit 5000: %v %v, want a 400 answer", m, err)
		}
		if res, err := delayd.CancelAll(ctx, b.NC, "met.none"); err != nil || res != (delayd.CancelAllResult{Complete: true}) {
			t.Fatalf("cancel-all met.none: %+v %v", res, err)
		}
		cancel()
	}

	var fams map[string]*dto.MetricFamily
	value := func(name string, labels map[string]string) float64 {
		f := fams[name]
		if f == nil {
			t.Fatalf("metric %s missing", name)
		}
	next:
		for _, mt := range f.Metric {
			for k, v := range labels {
				found := false
				for _, lp := range mt.Label {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case mt.Counter != nil:
				return mt.Counter.GetValue()
			case mt.Gauge != nil:
				return mt.Gauge.GetValue()
			case mt.Histogram != nil:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("metric %s%v missing", name, labels)
		return 0
	}
	scrape := func() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		if fams, err = p.TextToMetricFamilies(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	// The cancelled message is not pending from its cancel on (cancelled
	// ones are counted apart): the wait is for the deliveries, the routing
	// and the dead letters, which the router counts before it acks each
	// ingress message, so after the collector saw the deliveries.
	itest.WaitFor(t, time.Minute, "counters to settle", func() bool {
		scrape()
		return value("delayd_delivered_total", map[string]string{"stream": "DELAYD_100MS"}) == 5 &&
			value("delayd_level_pending_messages", map[string]string{"stream": "DELAYD_1H"}) == 3 &&
			value("delayd_routed_total", nil) == 9 &&
			value("delayd_dead_lettered_total", map[string]string{"reason": "level"}) == 2 &&
			value("delayd_dead_lettered_total", map[string]string{"reason": "target"}) == 1
	})
	for name, want := range map[string]float64{
		"delayd_routed_total": 9,
		"delayd_merged_total": 2,
		"delayd_ready":        1,
	} {
		if got := value(name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for result, want := range map[string]float64{"cancelled": 1, "not_found": 1, "already_delivered": 0} {
		if got := value("delayd_cancel_requests_total", map[string]string{"result": result}); got != want {
			t.Errorf("delayd_cancel_requests_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	for result, want := range map[string]float64{"pending": 1, "cancelled": 1, "not_found": 1, "already_delivered": 1, "busy": 0} {
		if got := value("delayd_status_requests_total", map[string]string{"result": result}); got != want {
			t.Errorf("delayd_status_requests_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	for name, want := range map[string]map[string]float64{
		"delayd_pending_requests_total":   {"ok": 1, "bad_request": 1, "busy": 0, "error": 0},
		"delayd_cancelall_requests_total": {"ok": 1, "bad_request": 0, "busy": 0, "error": 0},
	} {
		for result, w := range want {
			if got := value(name, map[string]string{"result": result}); got != w {
				t.Errorf("%s{result=%q} = %v, want %v", name, result, got, w)
			}
		}
	}
	if got := value("delayd_cancelled_total", map[string]string{"stream": "DELAYD_1H"}); got != 1 {
		t.Errorf("delayd_cancelled_total{stream=DELAYD_1H} = %v, want 1", got)
	}
	for reason, want := range map[string]float64{"level": 2, "target": 1, "size": 0, "undeliverable": 0} {
		if got := value("delayd_dead_lettered_total", map[string]string{"reason": reason}); got != want {
			t.Errorf("delayd_dead_lettered_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	if got := value("delayd_delivery_lateness_seconds", map[string]string{"stream": "DELAYD_100MS", "delay": "100ms"}); got != 5 {
		t.Errorf("lateness histogram count = %v, want 5", got)
	}
	if got := value("delayd_level_pending_messages", map[string]string{"stream": "DELAYD_100MS"}); got != 0 {
		t.Errorf("DELAYD_100MS pending = %v, want 0", got)
	}
	if got := value("delayd_level_oldest_due_age_seconds", map[string]string{"stream": "DELAYD_1H"}); got != 0 {
		t.Errorf("DELAYD_1H oldest due age = %v, want 0 (nothing due)", got)
	}
}
