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
// EndpointSlices without the labels above, kept as records (recordInformers).
func proxyInformers(c kubernetes.Interface) informers.SharedInformerFactory {
	f := informers.NewSharedInformerFactory(c, 0)
	recordInformers(f, func(o *metav1.ListOptions) { o.LabelSelector = proxySelector })
	return f
}

// recordInformers registers the Service and EndpointSlice informers of f
// with a transform that turns each object into its record (records.go)
// before it reaches the cache. Their stores then hold *serviceRecord and
// *sliceRecord: the factory's typed listers must not be used, and f must
// be the proxy's own factory (other roles need whole objects). This must
// run before anything asks f for these two informers (an informer is
// created once per type).
//
// tweak (nil for none) changes their lists and watches.
func recordInformers(f informers.SharedInformerFactory, tweak internalinterfaces.TweakListOptionsFunc) {
	// No namespace index: the proxy lists everything. Slices are indexed
	// by their Service, for partial syncs (proxier.delta).
	opts := func(resync time.Duration) internalinterfaces.InformerOptions {
		return internalinterfaces.InformerOptions{ResyncPeriod: resync, InformerName: f.InformerName(), TweakListOptions: tweak}
	}
	f.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		inf := coreinformers.NewServiceInformerWithOptions(c, metav1.NamespaceAll, opts(resync))
		_ = inf.SetTransform(toRecord) // cannot fail: the informer is not started
		return inf
	})
	f.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		o := opts(resync)
		o.Indexers = cache.Indexers{byService: sliceServiceIndex}
		inf := discoveryinformers.NewEndpointSliceInformerWithOptions(c, metav1.NamespaceAll, o)
		_ = inf.SetTransform(toRecord)
		return inf
	})
}

// byService indexes slice records by "namespace/service".
const byService = "service"

func sliceServiceIndex(obj any) ([]string, error) {
	if s, ok := obj.(*sliceRecord); ok && s.service != "" {
		return []string{s.serviceKey().String()}, nil
	}
	return nil, nil
}
