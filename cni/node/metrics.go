package node

import "github.com/prometheus/client_golang/prometheus"

// metrics are what an operator watches of pod networking on a node.
type metrics struct {
	duration prometheus.Histogram
	errors   prometheus.Counter
	routes   prometheus.Gauge
	offLink  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "netplane_podnetwork_sync_duration_seconds", Help: "Time of one pod-networking sync (bridge, masquerade, CNI files, routes).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_podnetwork_sync_errors_total", Help: "Pod-networking syncs that failed; the log says why.",
		}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_podnetwork_routes", Help: "Routes to other nodes' pod CIDRs this node wants.",
		}),
		offLink: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_podnetwork_nodes_off_link", Help: "Nodes whose pod CIDRs are not routed because they are not on this node's L2 segment.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.duration, m.errors, m.routes, m.offLink)
	}
	return m
}
