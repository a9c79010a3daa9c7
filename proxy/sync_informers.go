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

// Labels that keep a Service, and its EndpointSlices, away from the proxy,
// as from kube-proxy: a Service meant for another proxy implementation,
// and headless Services (no ClusterIP to program; their slices carry the
// label too).
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	labelHeadless         = v1.IsHeadlessService
)

// proxySelector is the label selector of the proxy's lists and watches.
var proxySelector = "!" + labelServiceProxyName + ",!" + labelHeadless

// proxyInformers is the proxy's own informer factory: Services and
// EndpointSlices without the labels above, slimmed (slimInformers).
func proxyInformers(c kubernetes.Interface) informers.SharedInformerFactory {
	f := informers.NewSharedInformerFactory(c, 0)
	slimInformers(f, func(o *metav1.ListOptions) { o.LabelSelector = proxySelector })
	return f
}

// slimInformers registers the Service and EndpointSlice informers of f with
// transforms that drop what the proxy never reads before objects reach the
// cache: managedFields (often the biggest part of an object), owner
// references and finalizers, the last-applied-configuration annotation, a
// Service's selector, every EndpointSlice annotation but the trigger time
// and every label but the Service name, and endpoints' targetRef, hostname
// and deprecatedTopology. At 10,000 Services that is most of the
// informers' memory.
//
// tweak (nil for none) changes their lists and watches. f must be the
// proxy's own factory (other roles need whole objects), and
// this must run before anything asks f for these two informers (an
// informer is created once per type).
func slimInformers(f informers.SharedInformerFactory, tweak internalinterfaces.TweakListOptionsFunc) {
	// The same options as the factory's own constructors.
	opts := func(resync time.Duration) internalinterfaces.InformerOptions {
		return internalinterfaces.InformerOptions{ResyncPeriod: resync, InformerName: f.InformerName(), TweakListOptions: tweak,
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
		o.ManagedFields, o.OwnerReferences, o.Finalizers = nil, nil, nil
		delete(o.Annotations, v1.LastAppliedConfigAnnotation)
		o.Spec.Selector = nil
	case *discovery.EndpointSlice:
		o.ManagedFields, o.OwnerReferences, o.Finalizers = nil, nil, nil
		o.Annotations = onlyKey(o.Annotations, v1.EndpointsLastChangeTriggerTime)
		o.Labels = onlyKey(o.Labels, discovery.LabelServiceName)
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef = nil
			o.Endpoints[i].Hostname = nil
			o.Endpoints[i].DeprecatedTopology = nil
		}
	}
	return obj, nil
}

// onlyKey is m reduced to key, or nil when m lacks it.
func onlyKey(m map[string]string, key string) map[string]string {
	if v, ok := m[key]; ok {
		return map[string]string{key: v}
	}
	return nil
}
