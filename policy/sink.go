package policy

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
)

// sink is the informer layer's Sink of one kind of record: a store whose
// writes go into the model, which keeps only what policy needs of each
// object, so the informers keep nothing. Every write asks for a sync.
type sink struct {
	e    *Feature
	kind informer.Kind
	// closed drops every write: the sink of a reflector stopped
	// (cnp_crd.go). Read and written with e.mu held.
	closed bool
}

var _ cache.Store = (*sink)(nil)

func (s *sink) Add(obj any) error    { return s.do(func() { s.e.upsert(obj) }) }
func (s *sink) Update(obj any) error { return s.do(func() { s.e.upsert(obj) }) }
func (s *sink) Delete(obj any) error {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	return s.do(func() { s.e.remove(obj) })
}

// Replace is a (re)list: the records given, and none of this kind besides.
// Only the records held before it can be gone: the first list, of every
// pod of the cluster, neither keeps a set of their keys nor stands in for
// them.
func (s *sink) Replace(list []any, _ string) error {
	return s.do(func() {
		held := s.e.records(s.kind)
		for _, obj := range list {
			s.e.upsert(obj)
		}
		if len(held) == 0 {
			return
		}
		keep := make(map[types.NamespacedName]bool, len(list))
		for _, obj := range list {
			keep[recordKey(obj)] = true
		}
		for _, gone := range held {
			if !keep[recordKey(gone)] {
				s.e.remove(gone)
			}
		}
	})
}

func (s *sink) do(fn func()) error {
	s.e.mu.Lock()
	if !s.closed {
		fn()
	}
	s.e.mu.Unlock()
	s.e.loop.Request()
	return nil
}

// The reads of a store: the informer layer never reads a sink.

func (s *sink) List() []any                          { return nil }
func (s *sink) ListKeys() []string                   { return nil }
func (s *sink) Get(any) (any, bool, error)           { return nil, false, nil }
func (s *sink) GetByKey(string) (any, bool, error)   { return nil, false, nil }
func (s *sink) Resync() error                        { return nil }
func (s *sink) LastStoreSyncResourceVersion() string { return "" }
func (s *sink) Bookmark(string)                      {}

func recordKey(obj any) types.NamespacedName {
	switch r := obj.(type) {
	case *Pod:
		return r.Key()
	case *Namespace:
		return types.NamespacedName{Name: r.Name}
	case *policyRecord:
		return r.key()
	case *clusterPolicyRecord:
		return r.key()
	case *Node:
		return types.NamespacedName{Name: r.Name}
	}
	return types.NamespacedName{}
}

// records are stand-ins for the records of kind the model holds, enough
// to remove them (remove reads only their keys). Called with mu held.
func (f *Feature) records(kind informer.Kind) []any {
	var out []any
	switch kind {
	case clusterPolicies, informer.Nodes:
		return f.clusterRecords(kind)
	case informer.Pods:
		for ns, st := range f.model.ns {
			for name := range st.pods {
				out = append(out, &Pod{Namespace: ns, Name: name})
			}
		}
	case informer.Namespaces:
		for name, st := range f.model.ns {
			if st.known {
				out = append(out, &Namespace{Name: name})
			}
		}
	case informer.NetworkPolicies:
		keys := map[types.NamespacedName]bool{}
		for key := range f.model.policies {
			keys[key] = true
		}
		for key := range f.invalid {
			keys[key] = true
		}
		for key := range keys {
			r := &policyRecord{}
			r.meta.Namespace, r.meta.Name = key.Namespace, key.Name
			out = append(out, r)
		}
	}
	return out
}
