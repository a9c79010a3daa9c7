package kit

import (
	"context"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typeddiscovery "k8s.io/client-go/kubernetes/typed/discovery/v1"
)

// CountWrites returns client with its EndpointSlice writes counted in m.
// With a budget, each create or update first tells it which Service key it
// writes for (namespace/service-name label), so that the write uses the
// reservation of that key's sync; see WriteBudget.
func CountWrites(client kubernetes.Interface, m *Metrics, budget *WriteBudget) kubernetes.Interface {
	return countingClient{Interface: client, m: m, budget: budget}
}

type countingClient struct {
	kubernetes.Interface
	m      *Metrics
	budget *WriteBudget
}

func (c countingClient) DiscoveryV1() typeddiscovery.DiscoveryV1Interface {
	return countingDiscovery{DiscoveryV1Interface: c.Interface.DiscoveryV1(), m: c.m, budget: c.budget}
}

type countingDiscovery struct {
	typeddiscovery.DiscoveryV1Interface
	m      *Metrics
	budget *WriteBudget
}

func (d countingDiscovery) EndpointSlices(ns string) typeddiscovery.EndpointSliceInterface {
	return countingSlices{EndpointSliceInterface: d.DiscoveryV1Interface.EndpointSlices(ns), m: d.m, budget: d.budget, ns: ns}
}

type countingSlices struct {
	typeddiscovery.EndpointSliceInterface
	m      *Metrics
	budget *WriteBudget
	ns     string
}

// writing passes the key es is written for to the budget. A delete names
// no Service; its sync's reservation ends when the sync does.
func (s countingSlices) writing(es *discoveryv1.EndpointSlice) {
	if s.budget != nil && es != nil {
		if svc, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
			s.budget.Writing(s.ns + "/" + svc)
		}
	}
}

func (s countingSlices) count(op string, err error) {
	if err == nil {
		s.m.changes.WithLabelValues(op).Inc()
	}
}

func (s countingSlices) Create(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.CreateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	out, err := s.EndpointSliceInterface.Create(ctx, es, o)
	s.count("create", err)
	return out, err
}

func (s countingSlices) Update(ctx context.Context, es *discoveryv1.EndpointSlice, o metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error) {
	s.writing(es)
	out, err := s.EndpointSliceInterface.Update(ctx, es, o)
	s.count("update", err)
	return out, err
}

func (s countingSlices) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	err := s.EndpointSliceInterface.Delete(ctx, name, o)
	s.count("delete", err)
	return err
}
