package endpointslice

import (
	"context"
	"errors"
	"slices"
	"sync"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typeddiscovery "k8s.io/client-go/kubernetes/typed/discovery/v1"
)

// Splicing the planner's writes of a narrowed sync. The planner gets
// slices cut down to the endpoints of the pods that changed (narrow.go);
// an update of a cut slice is put back into its whole slice on its way to
// the API server. A narrowed sync that would create or delete a slice, or
// change which endpoints a cut holds, needs more than the cut: the write
// fails, the splicer notes it, and the sync plans the whole Service.

var errWiden = errors.New("a narrowed sync changes more than the endpoints it was given")

// splicer holds the cuts of the narrowed syncs under way.
type splicer struct {
	mu       sync.Mutex
	cuts     map[string]cut  // by namespace/slice name
	services map[string]bool // namespace/name of each Service synced narrowed
	widen    map[string]bool // such Services that need the whole Service planned
}

func newSplicer() *splicer {
	return &splicer{cuts: map[string]cut{}, services: map[string]bool{}, widen: map[string]bool{}}
}

// begin registers the cuts of a narrowed sync of the Service ns/name.
func (s *splicer) begin(ns, name string, cuts map[string]cut) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services[ns+"/"+name] = true
	for slice, c := range cuts {
		s.cuts[ns+"/"+slice] = c
	}
}

// end forgets the sync's cuts and reports whether it needs widening.
func (s *splicer) end(ns, name string, cuts map[string]cut) (widen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ns + "/" + name
	widen = s.widen[key]
	delete(s.services, key)
	delete(s.widen, key)
	for slice := range cuts {
		delete(s.cuts, ns+"/"+slice)
	}
	return widen
}

// update returns what to write for the planner's update of es: es put
// back into its whole slice if it is a cut, es itself if it is not.
func (s *splicer) update(ns string, es *discovery.EndpointSlice) (*discovery.EndpointSlice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cuts[ns+"/"+es.Name]
	if !ok {
		return es, nil
	}
	whole, ok := splice(es, c)
	if !ok {
		s.widen[ns+"/"+es.Labels[discovery.LabelServiceName]] = true
		return nil, errWiden
	}
	return whole, nil
}

// allowed reports whether a create or delete of slice name, for the
// Service svc, may go ahead: not in a narrowed sync.
func (s *splicer) allowed(ns, svc, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, cut := s.cuts[ns+"/"+name]; cut {
		svc = c.whole.Labels[discovery.LabelServiceName]
	}
	if !s.services[ns+"/"+svc] {
		return true
	}
	s.widen[ns+"/"+svc] = true
	return false
}

// splice is the whole slice c was cut from with part's metadata and
// endpoints in it; false when part no longer holds the cut's endpoints in
// their order, or has other ports or addresses: the planner then reused
// the slice for endpoints of other ports, which the whole slice's other
// endpoints do not have.
func splice(part *discovery.EndpointSlice, c cut) (*discovery.EndpointSlice, bool) {
	if len(part.Endpoints) != len(c.at) || part.AddressType != c.whole.AddressType ||
		!equality.Semantic.DeepEqual(part.Ports, c.whole.Ports) {
		return nil, false
	}
	out := *part
	out.Endpoints = slices.Clone(c.whole.Endpoints)
	for j, i := range c.at {
		got, was := part.Endpoints[j].TargetRef, c.whole.Endpoints[i].TargetRef
		if got == nil || was == nil || got.Name != was.Name {
			return nil, false
		}
		out.Endpoints[i] = part.Endpoints[j]
	}
	return &out, true
}

// splicingClient is the planner's client: its slice writes pass through
// the splicer.
type splicingClient struct {
	kubernetes.Interface
	s *splicer
}

func (c splicingClient) DiscoveryV1() typeddiscovery.DiscoveryV1Interface {
	return splicingDiscovery{c.Interface.DiscoveryV1(), c.s}
}

type splicingDiscovery struct {
	typeddiscovery.DiscoveryV1Interface
	s *splicer
}

func (d splicingDiscovery) EndpointSlices(ns string) typeddiscovery.EndpointSliceInterface {
	return splicingSlices{d.DiscoveryV1Interface.EndpointSlices(ns), d.s, ns}
}

type splicingSlices struct {
	typeddiscovery.EndpointSliceInterface
	s  *splicer
	ns string
}

func (c splicingSlices) Create(ctx context.Context, es *discovery.EndpointSlice, o metav1.CreateOptions) (*discovery.EndpointSlice, error) {
	if !c.s.allowed(c.ns, es.Labels[discovery.LabelServiceName], es.Name) {
		return nil, errWiden
	}
	return c.EndpointSliceInterface.Create(ctx, es, o)
}

func (c splicingSlices) Update(ctx context.Context, es *discovery.EndpointSlice, o metav1.UpdateOptions) (*discovery.EndpointSlice, error) {
	whole, err := c.s.update(c.ns, es)
	if err != nil {
		return nil, err
	}
	return c.EndpointSliceInterface.Update(ctx, whole, o)
}

func (c splicingSlices) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	if !c.s.allowed(c.ns, "", name) {
		return errWiden
	}
	return c.EndpointSliceInterface.Delete(ctx, name, o)
}
