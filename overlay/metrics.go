package overlay

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/netplane/netplane/nodeview"
)

// Metrics are what an operator watches of the overlay; the caller
// registers Collectors with its registry.
type Metrics struct {
	// RemoteNodes counts the other nodes by path and family (a dual-stack
	// node counts once per family).
	RemoteNodes *prometheus.GaugeVec
	// LastSync is when the routes and entries last matched the plan.
	LastSync prometheus.Gauge
	// SyncErrors counts syncs that left something unwritten.
	SyncErrors prometheus.Counter
}

// NewMetrics makes the overlay's metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		RemoteNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_overlay_remote_nodes",
			Help: "Other nodes by the path to their pod CIDRs (direct, vxlan, none) and address family.",
		}, []string{"path", "family"}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_overlay_last_sync_timestamp_seconds",
			Help: "Unix time of the last sync that left the routes, neighbour and FDB entries as planned.",
		}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "netplane_overlay_sync_errors_total",
			Help: "Overlay syncs that failed to write something; the returned error says what.",
		}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.RemoteNodes, m.LastSync, m.SyncErrors}
}

func (m *Metrics) observe(p Plan, err error, start time.Time) {
	counts := map[[2]string]int{}
	for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
		for _, path := range []Path{Direct, VXLAN, None} {
			counts[[2]string{string(path), f.String()}] = 0
		}
	}
	for _, d := range p.Decisions {
		counts[[2]string{string(d.Path), d.Family.String()}]++
	}
	for k, n := range counts {
		m.RemoteNodes.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
	if err != nil {
		m.SyncErrors.Inc()
		return
	}
	m.LastSync.Set(float64(start.Unix()) + float64(start.Nanosecond())/1e9)
}
