package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the proxier's Prometheus metrics, named after kube-proxy's
// with the netplane_proxy_ prefix.
type metrics struct {
	syncDuration       *prometheus.HistogramVec
	programming        prometheus.Histogram
	pendingChanges     prometheus.Gauge
	syncFailures       prometheus.Counter
	noLocalEndpoints   *prometheus.GaugeVec
	lastSync           prometheus.Gauge
	conntrackDeletions prometheus.Counter
}

// newMetrics makes the metrics, unregistered (collectors).
func newMetrics() *metrics {
	return &metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "netplane_proxy_sync_duration_seconds",
			Help:    "Time one sync of the nftables rules took, by type (full or partial).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"type"}),
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
		syncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_proxy_sync_failures_total",
			Help: "Syncs whose nftables transaction failed (retried as a full sync).",
		}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_proxy_no_local_endpoints",
			Help: "Service ports with a Local traffic policy and no local endpoint (their traffic is dropped here), by traffic_policy.",
		}, []string{"traffic_policy"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_proxy_last_sync_timestamp_seconds",
			Help: "When the rules were last synced successfully.",
		}),
		conntrackDeletions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_proxy_conntrack_stale_udp_deleted_total",
			Help: "UDP conntrack entries deleted because their endpoint went away.",
		}),
	}
}

// collectors are the metrics to register.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.syncDuration, m.programming, m.pendingChanges, m.syncFailures, m.noLocalEndpoints, m.lastSync, m.conntrackDeletions}
}

// observeSync records a sync of kind (full or partial) that worked: it
// started at start and had its tables programmed at now, and carried the changes of triggers.
func (m *metrics) observeSync(kind string, start, now time.Time, triggers []time.Time) {
	m.syncDuration.WithLabelValues(kind).Observe(now.Sub(start).Seconds())
	m.lastSync.Set(float64(now.Unix()))
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
