package podnet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are what an operator watches of the pod network on a node; the
// routes to other nodes are the overlay's (netplane_overlay_*).
type metrics struct {
	duration prometheus.Histogram
	errors   prometheus.Counter
}

// newMetrics makes the metrics, unregistered (collectors).
func newMetrics() metrics {
	return metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "netplane_podnetwork_sync_duration_seconds", Help: "Time of one pod-network sync (bridge, sysctls, masquerade, CNI files).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_podnetwork_sync_errors_total", Help: "Pod-network syncs that failed; the log says why.",
		}),
	}
}

// collectors are the metrics to register.
func (m metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.errors}
}

// start times a sync; the returned function records its end.
func (m metrics) start() func(error) {
	t := time.Now()
	return func(err error) {
		m.duration.Observe(time.Since(t).Seconds())
		if err != nil {
			m.errors.Inc()
		}
	}
}
