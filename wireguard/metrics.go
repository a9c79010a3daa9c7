package wireguard

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are what an operator watches of the encryption; the caller
// registers Collectors with its registry.
type Metrics struct {
	// Peers counts the other nodes by state: up (a handshake within
	// Fresh), stale (a peer without one), rejected (no valid key, no
	// address, or a conflict: their pod traffic is dropped).
	Peers *prometheus.GaugeVec
	// Bytes is what the device moved, all peers, by direction; it starts
	// again from zero when a userspace device restarts.
	Bytes *prometheus.GaugeVec
	// Implementation is 1 for the implementation that runs.
	Implementation *prometheus.GaugeVec
	// The sync's duration, errors and time are the node role's family
	// (nodeview.Loop), labelled feature="wireguard".
}

// NewMetrics makes the metrics, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		Peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_wireguard_peers",
			Help: "Other nodes by WireGuard state: up (handshake within 3 minutes), stale, rejected (no valid key: their pod traffic is dropped).",
		}, []string{"state"}),
		Bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_wireguard_bytes",
			Help: "Bytes through the WireGuard device since it started, all peers, by direction (sent, received).",
		}, []string{"direction"}),
		Implementation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "netplane_wireguard_implementation",
			Help: "1 for the WireGuard implementation that runs: kernel or userspace.",
		}, []string{"implementation"}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Peers, m.Bytes, m.Implementation}
}

// Running records which implementation runs.
func (m *Metrics) Running(impl string) {
	for _, i := range []string{Kernel, Userspace} {
		v := 0.0
		if i == impl {
			v = 1
		}
		m.Implementation.WithLabelValues(i).Set(v)
	}
}

// Observe records the statistics read after a sync or between syncs.
func (m *Metrics) Observe(st Stats) {
	m.Peers.WithLabelValues("up").Set(float64(st.Up))
	m.Peers.WithLabelValues("stale").Set(float64(st.Stale))
	m.Peers.WithLabelValues("rejected").Set(float64(st.NoKey))
	m.Bytes.WithLabelValues("sent").Set(float64(st.TxBytes))
	m.Bytes.WithLabelValues("received").Set(float64(st.RxBytes))
}
