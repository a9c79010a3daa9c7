package kit

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typeddiscovery "k8s.io/client-go/kubernetes/typed/discovery/v1"
)

// CountWrites returns client with its EndpointSlice writes counted in m.
// With a budget, each create or update first tells it which Service key it
// writes for (namespace/service-name label), so that the write uses the
// reservation of that key's sync; see WriteBudget. At log level 5 each
// write is logged with its Service and how long it took, for the traces of
// the benchmark (bench_test.go).
func CountWrites(client kubernetes.Interface, m *Metrics, budget *WriteBudget, log logr.Logger) kubernetes.Interface {
	return countingClient{Interface: client, w: writes{m: m, budget: budget, log: log.V(5)}}
}

// writes is what the wrapper needs to count, budget and log a write.
type writes struct {
	m      *Metrics
	budget *WriteBudget
	log    logr.Logger
}

type countingClient struct {
	kubernetes.Interface
	w writes
}

func (c countingClient) DiscoveryV1() typeddiscovery.DiscoveryV1Interface {
	return countingDiscovery{DiscoveryV1Interface: c.Interface.DiscoveryV1(), w: c.w}
}

type countingDiscovery struct {
	typeddiscovery.DiscoveryV1Interface
	w writes
}

func (d countingDiscovery) EndpointSlices(ns string) typeddiscovery.EndpointSliceInterface {
	return countingSlices{EndpointSliceInterface: d.DiscoveryV1Interface.EndpointSlices(ns), w: d.w, ns: ns}
}

type countingSlices struct {
	typeddiscovery.EndpointSliceInterface
	w  writes
	ns string
}

// writing passes the key es is written for to the budget. A delete names
// no Service; its sync's reservation ends when the sync does.
func (s countingSlices) writing(es *discoveryv1.EndpointSlice) {
	if s.w.budget != nil && es != nil {
		if svc, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
			s.w.budget.Writing(s.ns + "/" + svc)
		}
	}
}

// done counts and logs a write that started at start.
func (s countingSlices) done(op string, es *discoveryv1.EndpointSlice, start time.Time, err error) {
	if err == nil {
		s.w.m.changes.WithLabelValues(op).Inc()
	}
	if s.w.log.Enabled() && es != nil {
		s.w.log.Info("Wrote EndpointSlice", "operation", op, "service", s.ns+"/"+es.Labels[discoveryv1.LabelServiceName],
			"took", time.Since(start), "err", err)
	}
}

func (s countingSlices) Create(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.CreateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	start := time.Now()
	out, err := s.EndpointSliceInterface.Create(ctx, es, o)
	s.done("create", es, start, err)
	return out, err
}

func (s countingSlices) Update(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	start := time.Now()
	out, err := s.EndpointSliceInterface.Update(ctx, es, o)
	s.done("update", es, start, err)
	return out, err
}

func (s countingSlices) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	err := s.EndpointSliceInterface.Delete(ctx, name, o)
	s.done("delete", nil, time.Time{}, err)
	return err
}
