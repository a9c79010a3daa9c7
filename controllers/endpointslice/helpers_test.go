package endpointslice

import (
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/controllers/internal/kit"
	"github.com/netplane/netplane/internal/informer"
)

func logrDiscard() logr.Logger { return logr.Discard() }

func intstrFromInt(i int) intstr.IntOrString { return intstr.FromInt32(int32(i)) }

// newFakeClient is a fake clientset that, like the API server, names
// objects created with generateName, gives them a UID, and bumps a slice's generation on
// every write, which the stale-cache tracker relies on. onWrite sees
// each written slice as stored (recorded actions hold copies from before).
func newFakeClient(onWrite func(verb string, s *discovery.EndpointSlice)) *fake.Clientset {
	c := fake.NewClientset()
	var n atomic.Int64
	c.PrependReactor("create", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*discovery.EndpointSlice)
		for s.Name == "" && s.GenerateName != "" { // the next name not taken
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n.Add(1))
			if _, err := c.Tracker().Get(a.GetResource(), s.Namespace, s.Name); err == nil {
				s.Name = ""
			}
		}
		s.UID, s.Generation = types.UID(s.Name+"-uid"), 1
		onWrite("create", s.DeepCopy())
		return false, nil, nil
	})
	c.PrependReactor("update", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*discovery.EndpointSlice)
		if stored, err := c.Tracker().Get(a.GetResource(), s.Namespace, s.Name); err == nil && s.UID == "" {
			s.UID = stored.(*discovery.EndpointSlice).UID // an update keeps the UID
		}
		s.Generation++
		onWrite("update", s.DeepCopy())
		return false, nil, nil
	})
	return c
}

// informerSource is a client-go informer as a kit.Source: the unit tests
// fill its cache by hand and never start it.
type informerSource struct{ cache.SharedIndexInformer }

func (s informerSource) Indexer() cache.Indexer { return s.GetIndexer() }

// sourcesOf are the informers of f as the controllers read them, with the
// controller's indexes (Indexers) added.
func sourcesOf(f informers.SharedInformerFactory) kit.Sources {
	ix := Indexers()
	src := func(k informer.Kind, inf cache.SharedIndexInformer) kit.Source {
		for name, fn := range ix[k] {
			if err := addIndex(inf, name, fn); err != nil {
				panic(err)
			}
		}
		return informerSource{inf}
	}
	return kit.Sources{
		Services:       src(informer.Services, f.Core().V1().Services().Informer()),
		Pods:           src(informer.Pods, f.Core().V1().Pods().Informer()),
		Nodes:          src(informer.Nodes, f.Core().V1().Nodes().Informer()),
		Endpoints:      src(informer.Endpoints, f.Core().V1().Endpoints().Informer()),
		EndpointSlices: src(informer.EndpointSlices, f.Discovery().V1().EndpointSlices().Informer()),
	}
}

// addIndex adds fn as index name to informer, unless it already has it
// (another controller built on the same factory added it).
func addIndex(informer cache.SharedIndexInformer, name string, fn cache.IndexFunc) error {
	if _, ok := informer.GetIndexer().GetIndexers()[name]; ok {
		return nil
	}
	if err := informer.AddIndexers(cache.Indexers{name: fn}); err != nil {
		return fmt.Errorf("adding index %s: %w", name, err)
	}
	return nil
}
