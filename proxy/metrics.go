package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxier's Prometheus metrics, named after kube-proxy's
// with the netplane_proxy_ prefix. A sync's duration, failures and time
// are the node role's family (nodeview.Loop), labelled feature="proxy".
type metrics struct {
	programming        prometheus.Histogram
	pendingChanges     prometheus.Gauge
	noLocalEndpoints   *prometheus.GaugeVec
	conntrackDeletions prometheus.Counter
}

// newMetrics makes the metrics, unregistered (collectors).
func newMetrics() *metrics {
	return &metrics{
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "netplane_proxy_network_programming_duration_seconds",
			Help: "Time from an endpoint change (the EndpointSlice's last-change-trigger-time) to its rules being in the kernel.",
			Buckets: []float64{0.25, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
				31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 65, 70, 75, 80, 85,
				90, 95, 100, 105, 110, 115, 120, 150, 180, 210, 240, 270, 300},
		}),
		pendingChanges: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_proxy_pending_changes",
			Help: "Service and EndpointSlice changes received and not yet programmed.",
		}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_proxy_no_local_endpoints",
			Help: "Service ports with a Local traffic policy and no local endpoint (their traffic is dropped here), by traffic_policy.",
		}, []string{"traffic_policy"}),
		conntrackDeletions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_proxy_conntrack_stale_udp_deleted_total",
			Help: "UDP conntrack entries deleted because their endpoint went away.",
		}),
	}
}

// collectors are the metrics to register.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.programming, m.pendingChanges, m.noLocalEndpoints, m.conntrackDeletions}
}

// observeProgramming records a sync that worked, whose tables were
// programmed at now, carrying the changes of triggers.
func (m *metrics) observeProgramming(now time.Time, triggers []time.Time) {
	for _, t := range triggers {
		m.programming.Observe(now.Sub(t).Seconds())
	}
}

// observeNoLocal records the counts of Service ports with Local policy and
// no local endpoint, by traffic policy.
func (m *metrics) observeNoLocal(internal, external int) {
	m.noLocalEndpoints.WithLabelValues("internal").Set(float64(internal))
	m.noLocalEndpoints.WithLabelValues("external").Set(float64(external))
}
