package kit

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// Metrics are one controller's Prometheus metrics, named
// netplane_<subsystem>_*.
type Metrics struct {
	syncs   *prometheus.CounterVec
	changes *prometheus.CounterVec

	mu      sync.Mutex
	desired map[string]int // per Service (or Endpoints) key
}

// NewMetrics registers the metrics of subsystem on reg. slices reports how
// many slices the controller manages right now (read at scrape time).
func NewMetrics(reg prometheus.Registerer, subsystem string, slices func() int) (*Metrics, error) {
	m := &Metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "netplane", Subsystem: subsystem, Name: "syncs_total",
			Help: "Syncs by result: success, stale (cache behind our writes, retried) or error.",
		}, []string{"result"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "netplane", Subsystem: subsystem, Name: "changes_total",
			Help: "EndpointSlice writes by operation: create, update, delete.",
		}, []string{"operation"}),
		desired: map[string]int{},
	}
	desired := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "netplane", Subsystem: subsystem, Name: "desired_endpoints",
		Help: "Endpoints the controller wants published, summed over all Services.",
	}, func() float64 { return float64(m.totalDesired()) })
	count := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "netplane", Subsystem: subsystem, Name: "slices",
		Help: "EndpointSlices this controller manages, as its cache sees them.",
	}, func() float64 { return float64(slices()) })
	for _, c := range []prometheus.Collector{m.syncs, m.changes, desired, count} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveSync counts one sync by its result.
func (m *Metrics) ObserveSync(err error) {
	result := "success"
	switch {
	case errors.Is(err, ErrStaleCache):
		result = "stale"
	case err != nil:
		result = "error"
	}
	m.syncs.WithLabelValues(result).Inc()
}

// SetDesired records how many endpoints key should have; 0 forgets it.
func (m *Metrics) SetDesired(key string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n == 0 {
		delete(m.desired, key)
		return
	}
	m.desired[key] = n
}

func (m *Metrics) totalDesired() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	for _, n := range m.desired {
		total += n
	}
	return total
}

// CountManaged returns a counter of the slices in lister whose managed-by
// label is manager, for the slices metric.
func CountManaged(lister discoverylisters.EndpointSliceLister, manager string) func() int {
	sel := labels.Set{discoveryv1.LabelManagedBy: manager}.AsSelectorPreValidated()
	return func() int {
		all, err := lister.List(sel)
		if err != nil {
			return 0
		}
		return len(all)
	}
}
