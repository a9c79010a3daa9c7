package overlay

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/netplane/netplane/nodeview"
)

// Metrics are what an operator watches of the overlay; the caller
// registers Collectors with its registry.
type Metrics struct {
	// RemoteNodes counts the other nodes by path and family (a dual-stack
	// node counts once per family).
	// The sync's duration, errors and time are the node role's family
	// (nodeview.Loop), labelled feature="overlay".
	RemoteNodes *prometheus.GaugeVec
}

// NewMetrics makes the overlay's metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		RemoteNodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_overlay_remote_nodes",
			Help: "Other nodes by the path to their pod CIDRs (direct, vxlan, none) and address family.",
		}, []string{"path", "family"}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.RemoteNodes}
}

func (m *Metrics) observe(p Plan) {
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
}
