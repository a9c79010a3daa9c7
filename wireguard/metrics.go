package wireguard

import (
	"time"

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
	// LastSync is when the device last matched the plan.
	LastSync prometheus.Gauge
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
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "netplane_wireguard_last_sync_timestamp_seconds",
			Help: "Unix time of the last sync that left the WireGuard device as planned.",
		}),
	}
}

// Collectors are the metrics to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Peers, m.Bytes, m.Implementation, m.LastSync}
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

// Observe records the statistics of a sync that ended at at; a failed
// sync leaves LastSync as it was.
func (m *Metrics) Observe(st Stats, synced bool, at time.Time) {
	m.Peers.WithLabelValues("up").Set(float64(st.Up))
	m.Peers.WithLabelValues("stale").Set(float64(st.Stale))
	m.Peers.WithLabelValues("rejected").Set(float64(st.NoKey))
	m.Bytes.WithLabelValues("sent").Set(float64(st.TxBytes))
	m.Bytes.WithLabelValues("received").Set(float64(st.RxBytes))
	if synced {
		m.LastSync.Set(float64(at.UnixNano()) / 1e9)
	}
}
