package relay

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's: what it holds, and what it sends to node roles.
// A nil *Metrics counts nothing.
type Metrics struct {
	watchers prometheus.Gauge
	bytes    *prometheus.CounterVec
	frames   prometheus.Counter
	refusals prometheus.Counter
}

// NewMetrics registers the relay's metrics on r, and a gauge of the pods
// store holds.
func NewMetrics(r prometheus.Registerer, store *Store) *Metrics {
	m := &Metrics{
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "netplane_relay_watchers", Help: "Watches of node roles open on this relay."}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "netplane_relay_sent_bytes_total", Help: "Bytes sent to node roles, by list or watch."},
			[]string{"request"}),
		frames:   prometheus.NewCounter(prometheus.CounterOpts{Name: "netplane_relay_watch_events_total", Help: "Watch events sent to node roles (changes and bookmarks)."}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{Name: "netplane_relay_refused_total", Help: "Requests refused for their token."}),
	}
	pods := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "netplane_relay_pods", Help: "Pods the relay holds."}, func() float64 { return float64(store.Len()) })
	r.MustRegister(m.watchers, m.bytes, m.frames, m.refusals, pods)
	return m
}

func (m *Metrics) watching(d float64) {
	if m != nil {
		m.watchers.Add(d)
	}
}

func (m *Metrics) sent(n int) {
	if m != nil {
		m.bytes.WithLabelValues("watch").Add(float64(n))
		m.frames.Inc()
	}
}

func (m *Metrics) listed(n int) {
	if m != nil {
		m.bytes.WithLabelValues("list").Add(float64(n))
	}
}

func (m *Metrics) refused() {
	if m != nil {
		m.refusals.Inc()
	}
}
