// Package metrics exposes a running delayd as Prometheus metrics.
//
// Everything but the lateness histogram is read at scrape time from the
// service's atomic counters: a scrape costs O(levels) and takes no lock on
// the router's or scanners' hot path. The histogram is observed by each
// scanner as it publishes (an atomic add per delivery).
package metrics

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
)

// LatenessBuckets are the lateness histogram's upper bounds, in seconds:
// 1 ms to 10 s.
var LatenessBuckets = []float64{0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Metrics is delayd's Prometheus collector. Register it, and pass
// [Metrics.ObserveDelivery] as deliver.Config.OnDelivery.
type Metrics struct {
	svc *deliver.Service
	nc  *nats.Conn

	lateness  *prometheus.HistogramVec
	observers sync.Map // stream -> prometheus.Observer

	pending, oldestDue, delivered, retries, commitLag *prometheus.Desc
	cancelledPending                                  *prometheus.Desc
	routed, clamped, deadLettered, reconnects, ready  *prometheus.Desc
	cancelled, cancels, statuses, merged, indexErrors *prometheus.Desc
	dlqFailures, dlqWaiting                           *prometheus.Desc
	answersKept, answersSkipped                       *prometheus.Desc
	leaseHeld, leaseEpoch, failovers, fencedWrites    *prometheus.Desc
	replicasLive, leaseShare                          *prometheus.Desc
	lists, cancelAlls, reschedules                    *prometheus.Desc
}

// New returns the collector for svc, whose connection is nc.
func New(svc *deliver.Service, nc *nats.Conn) *Metrics {
	lv := []string{"stream", "delay"}
	return &Metrics{
		svc: svc, nc: nc,
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "delayd_delivery_lateness_seconds",
			Help:    "Lateness of each delivery: publish time minus due time, by the server's clock.",
			Buckets: LatenessBuckets,
		}, lv),
		pending:          prometheus.NewDesc("delayd_level_pending_messages", "Messages in the level stream past its committed offset, cancelled ones not counted.", lv, nil),
		cancelledPending: prometheus.NewDesc("delayd_level_cancelled_messages", "Cancelled messages still in the level stream past its committed offset (tombstoned, not yet passed): never delivered.", lv, nil),
		oldestDue:        prometheus.NewDesc("delayd_level_oldest_due_age_seconds", "How long the level's due head has waited undelivered; 0 if nothing is due.", lv, nil),
		delivered:        prometheus.NewDesc("delayd_delivered_total", "Deliveries confirmed by their target (PubAck or flush).", lv, nil),
		retries:          prometheus.NewDesc("delayd_delivery_retries_total", "Deliveries a target refused and that were tried again.", lv, nil),
		commitLag:        prometheus.NewDesc("delayd_offset_commit_lag_messages", "Confirmed deliveries whose offset write the KV bucket has not acknowledged yet.", lv, nil),
		routed:           prometheus.NewDesc("delayd_routed_total", "Ingress messages written to a level stream.", nil, nil),
		clamped:          prometheus.NewDesc("delayd_clamped_total", "Delay-Level values above the table, clamped to the highest level.", nil, nil),
		deadLettered:     prometheus.NewDesc("delayd_dead_lettered_total", "Messages written to DELAYD_DLQ, by reason.", []string{"reason"}, nil),
		reconnects:       prometheus.NewDesc("delayd_nats_reconnects_total", "Reconnections of delayd's NATS connection.", nil, nil),
		ready:            prometheus.NewDesc("delayd_ready", "1 when /readyz would answer 200.", nil, nil),
		cancelled:        prometheus.NewDesc("delayd_cancelled_total", "Pending messages cancelled through the cancel API (delayd.api.cancel.<target>, delayd.api.cancel) or the cancel-all API (delayd.api.cancelall.<target>), by the level that held them.", lv, nil),
		cancels:          prometheus.NewDesc("delayd_cancel_requests_total", "Answers of the cancel API, by result: cancelled, not_found, already_delivered, busy (answered 429 at once: too many waiting).", []string{"result"}, nil),
		statuses:         prometheus.NewDesc("delayd_status_requests_total", "Answers of the status API (delayd.api.status.<target>, delayd.api.status), by result: pending, cancelled, not_found, already_delivered, busy (answered 429 at once: too many waiting, the cancel API's queue).", []string{"result"}, nil),
		lists:            prometheus.NewDesc("delayd_pending_requests_total", "Answers of the list API (delayd.api.pending.<target>), by result: ok, bad_request (400), busy (429: its queue full, or its paced reads would wait past 10 s), error.", []string{"result"}, nil),
		cancelAlls:       prometheus.NewDesc("delayd_cancelall_requests_total", "Answers of the cancel-all API (delayd.api.cancelall.<target>), by result: ok (complete or not), bad_request (400), busy (429), error; the messages they cancelled count in delayd_cancelled_total.", []string{"result"}, nil),
		reschedules:      prometheus.NewDesc("delayd_reschedule_requests_total", "Answers of the reschedule API (delayd.api.reschedule.<target>, delayd.api.reschedule), by result: rescheduled, not_found, already_delivered, bad_request (400), busy (429: the cancel API's queue), error.", []string{"result"}, nil),
		merged:           prometheus.NewDesc("delayd_merged_total", "Messages merged into a pending message with the same Delay-Merge-Key and target (their payloads dropped).", nil, nil),
		indexErrors:      prometheus.NewDesc("delayd_index_errors_total", "Id index writes that failed: those messages answer \"not found\" to a cancel.", nil, nil),
		answersKept:      prometheus.NewDesc("delayd_answers_kept_total", "Final answers (delivered, cancelled) written to DELAYD_ANSWERS before the id index trim purged their records.", nil, nil),
		answersSkipped:   prometheus.NewDesc("delayd_answers_skipped_total", "Id index messages (each holds the records of one or more messages) the trim purged without keeping their answers, because the answers fell behind beyond their bound: those messages answer \"not found\" about a minute after leaving their level (docs/guarantees.md#what-kept-answers-cost).", nil, nil),
		dlqFailures:      prometheus.NewDesc("delayd_dead_letter_failures_total", "Dead-letter writes DELAYD_DLQ refused (every attempt); each is retried until stored.", nil, nil),
		dlqWaiting:       prometheus.NewDesc("delayd_dead_letters_waiting", "Dead letters DELAYD_DLQ refused that are not stored yet (their messages are neither acked nor passed).", nil, nil),
		leaseHeld:        prometheus.NewDesc("delayd_lease_held", "1 while this process holds the lease (router, level.<stream>) and runs its work.", []string{"lease"}, nil),
		leaseEpoch:       prometheus.NewDesc("delayd_lease_epoch", "The epoch of this process's last term of the lease; 0 if it never held it.", []string{"lease"}, nil),
		failovers:        prometheus.NewDesc("delayd_failovers_total", "Terms of this process's leases that ended without a graceful release (expired, lost to another holder, or given up when fenced): each hands the work to another replica after the lease TTL.", []string{"lease"}, nil),
		replicasLive:     prometheus.NewDesc("delayd_replicas_live", "delayd processes (replicas) this one counts as live, itself included: those that bid for leases and whose membership key in DELAYD_LEASES changed within the lease TTL.", nil, nil),
		leaseShare:       prometheus.NewDesc("delayd_lease_share", "This process's share of the leases, ceil(leases / live replicas): it bids for a free lease only while it holds fewer, and hands the surplus over when it holds more.", nil, nil),
		fencedWrites:     prometheus.NewDesc("delayd_fenced_writes_total", "Offset commits refused by their compare-and-set because another owner wrote the offset (also after the term ended), and router terms fenced because a router of a newer term wrote the level stream (its epoch marker, or past this router's writes; also when the refusal came after the term ended) or, under stream DELAYD_INGRESS, created its ingress consumer; each stopped the level, or the router, in this process, and counts once per term.", lv, nil),
	}
}

// ObserveDelivery records one delivery's lateness; it is the service's
// OnDelivery hook.
func (m *Metrics) ObserveDelivery(stream string, lateness time.Duration) {
	o, ok := m.observers.Load(stream)
	if !ok {
		o, _ = m.observers.LoadOrStore(stream, m.lateness.WithLabelValues(stream, delayLabel(stream)))
	}
	o.(prometheus.Observer).Observe(lateness.Seconds())
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.lateness.Describe(ch)
	for _, d := range []*prometheus.Desc{
		m.pending, m.cancelledPending, m.oldestDue, m.delivered, m.retries, m.commitLag, m.routed, m.clamped, m.deadLettered, m.reconnects, m.ready,
		m.cancelled, m.cancels, m.statuses, m.merged, m.indexErrors, m.dlqFailures, m.dlqWaiting, m.answersKept, m.answersSkipped,
		m.leaseHeld, m.leaseEpoch, m.failovers, m.fencedWrites, m.replicasLive, m.leaseShare, m.lists, m.cancelAlls, m.reschedules,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.lateness.Collect(ch)
	rs, ss := m.svc.Stats()
	cancelled := m.svc.CancelledPending()
	for _, s := range ss {
		l := []string{s.Stream, delayLabel(s.Stream)}
		c := cancelled[s.Stream]
		ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, float64(s.Pending-min(s.Pending, c)), l...)
		ch <- prometheus.MustNewConstMetric(m.cancelledPending, prometheus.GaugeValue, float64(c), l...)
		ch <- prometheus.MustNewConstMetric(m.oldestDue, prometheus.GaugeValue, s.OldestDueAge.Seconds(), l...)
		ch <- prometheus.MustNewConstMetric(m.delivered, prometheus.CounterValue, float64(s.Delivered), l...)
		ch <- prometheus.MustNewConstMetric(m.retries, prometheus.CounterValue, float64(s.Retries), l...)
		ch <- prometheus.MustNewConstMetric(m.commitLag, prometheus.GaugeValue, float64(s.CommitLag), l...)
		ch <- prometheus.MustNewConstMetric(m.cancelled, prometheus.CounterValue, float64(s.Cancelled), l...)
		ch <- prometheus.MustNewConstMetric(m.fencedWrites, prometheus.CounterValue, float64(s.FencedWrites+rs.FencedWrites[s.Stream]), l...)
	}
	// Router terms stopped by a newer term's ingress consumer: no level's.
	ch <- prometheus.MustNewConstMetric(m.fencedWrites, prometheus.CounterValue, float64(rs.FencedWrites[deliver.IngressStream]), deliver.IngressStream, "")
	for _, ls := range m.svc.Leases() {
		held := 0.0
		if ls.Held {
			held = 1
		}
		ch <- prometheus.MustNewConstMetric(m.leaseHeld, prometheus.GaugeValue, held, ls.Key)
		ch <- prometheus.MustNewConstMetric(m.leaseEpoch, prometheus.GaugeValue, float64(ls.Epoch), ls.Key)
		ch <- prometheus.MustNewConstMetric(m.failovers, prometheus.CounterValue, float64(ls.Failovers), ls.Key)
	}
	if live, share, _ := m.svc.Balance(); live > 0 {
		ch <- prometheus.MustNewConstMetric(m.replicasLive, prometheus.GaugeValue, float64(live))
		ch <- prometheus.MustNewConstMetric(m.leaseShare, prometheus.GaugeValue, float64(share))
	}
	cs := m.svc.CancelStats()
	ch <- prometheus.MustNewConstMetric(m.cancels, prometheus.CounterValue, float64(cs.Cancelled), "cancelled")
	ch <- prometheus.MustNewConstMetric(m.cancels, prometheus.CounterValue, float64(cs.NotFound), "not_found")
	ch <- prometheus.MustNewConstMetric(m.cancels, prometheus.CounterValue, float64(cs.AlreadyDelivered), "already_delivered")
	ch <- prometheus.MustNewConstMetric(m.cancels, prometheus.CounterValue, float64(cs.Busy), "busy")
	st := m.svc.StatusStats()
	ch <- prometheus.MustNewConstMetric(m.statuses, prometheus.CounterValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(m.statuses, prometheus.CounterValue, float64(st.Cancelled), "cancelled")
	ch <- prometheus.MustNewConstMetric(m.statuses, prometheus.CounterValue, float64(st.NotFound), "not_found")
	ch <- prometheus.MustNewConstMetric(m.statuses, prometheus.CounterValue, float64(st.AlreadyDelivered), "already_delivered")
	ch <- prometheus.MustNewConstMetric(m.statuses, prometheus.CounterValue, float64(st.Busy), "busy")
	for desc, rs := range map[*prometheus.Desc]deliver.RequestStats{m.lists: m.svc.ListStats(), m.cancelAlls: m.svc.CancelAllStats()} {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(rs.OK), "ok")
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(rs.BadRequest), "bad_request")
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(rs.Busy), "busy")
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(rs.Failed), "error")
	}
	rss := m.svc.RescheduleStats()
	for result, n := range map[string]uint64{"rescheduled": rss.Rescheduled, "not_found": rss.NotFound, "already_delivered": rss.AlreadyDelivered, "bad_request": rss.BadRequest, "busy": rss.Busy, "error": rss.Failed} {
		ch <- prometheus.MustNewConstMetric(m.reschedules, prometheus.CounterValue, float64(n), result)
	}
	as := m.svc.AnswerStats()
	ch <- prometheus.MustNewConstMetric(m.answersKept, prometheus.CounterValue, float64(as.Kept))
	ch <- prometheus.MustNewConstMetric(m.answersSkipped, prometheus.CounterValue, float64(as.Skipped))
	ch <- prometheus.MustNewConstMetric(m.merged, prometheus.CounterValue, float64(rs.Merged))
	ch <- prometheus.MustNewConstMetric(m.indexErrors, prometheus.CounterValue, float64(rs.IndexErrors))
	ch <- prometheus.MustNewConstMetric(m.routed, prometheus.CounterValue, float64(rs.Routed))
	ch <- prometheus.MustNewConstMetric(m.clamped, prometheus.CounterValue, float64(rs.Clamped))
	for reason, n := range m.svc.DeadLetters() {
		ch <- prometheus.MustNewConstMetric(m.deadLettered, prometheus.CounterValue, float64(n), reason)
	}
	dr := m.svc.DLQRefusals()
	ch <- prometheus.MustNewConstMetric(m.dlqFailures, prometheus.CounterValue, float64(dr.Failures))
	ch <- prometheus.MustNewConstMetric(m.dlqWaiting, prometheus.GaugeValue, float64(dr.Waiting))
	ch <- prometheus.MustNewConstMetric(m.reconnects, prometheus.CounterValue, float64(m.nc.Stats().Reconnects))
	ready := 0.0
	if m.svc.Ready() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(m.ready, prometheus.GaugeValue, ready)
}

// delayLabel is a level stream's delay in Go's form ("5s", "1m30s"), or the
// stream name without its prefix if it is not a level stream.
func delayLabel(stream string) string {
	if d, ok := levels.ParseStreamName(stream); ok {
		return levels.FormatDuration(d)
	}
	return strings.TrimPrefix(stream, levels.StreamPrefix)
}

// Handler serves the collector, with the Go runtime's and the process's
// standard metrics, in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
