package proxy

import (
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/informers/internalinterfaces"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// slimInformers registers the Service and EndpointSlice informers of f with
// transforms that drop what the proxy never reads before objects reach the
// cache: managedFields (often the biggest part of an object), the
// last-applied-configuration annotation, every EndpointSlice annotation but
// the trigger time, and endpoints' targetRef and deprecatedTopology. At
// 10,000 Services that is most of the informers' memory.
//
// It must run before anything else asks f for these two informers (the
// informer is created once per type); Nodes are left whole, since the node
// role's pod networking reads them from the same factory.
func slimInformers(f informers.SharedInformerFactory) {
	// The same options as the factory's own constructors.
	opts := func(resync time.Duration) internalinterfaces.InformerOptions {
		return internalinterfaces.InformerOptions{ResyncPeriod: resync, InformerName: f.InformerName(),
			Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}}
	}
	f.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		inf := coreinformers.NewServiceInformerWithOptions(c, metav1.NamespaceAll, opts(resync))
		_ = inf.SetTransform(slimObject) // cannot fail: the informer is not started
		return inf
	})
	f.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		inf := discoveryinformers.NewEndpointSliceInformerWithOptions(c, metav1.NamespaceAll, opts(resync))
		_ = inf.SetTransform(slimObject)
		return inf
	})
}

// slimObject trims a Service or an EndpointSlice in place: the object comes
// fresh from the decoder and nothing else holds it yet.
func slimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		o.ManagedFields = nil
		delete(o.Annotations, v1.LastAppliedConfigAnnotation)
	case *discovery.EndpointSlice:
		o.ManagedFields = nil
		if t, ok := o.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
			o.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: t}
		} else {
			o.Annotations = nil
		}
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef = nil
			o.Endpoints[i].DeprecatedTopology = nil
		}
	}
	return obj, nil
}
