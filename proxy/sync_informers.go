package proxy

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/nodeview"
)

// Labels that keep a Service, and its EndpointSlices, away from the proxy,
// as from kube-proxy: a Service meant for another proxy implementation,
// and headless Services (no ClusterIP to program; their slices carry the
// label too).
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	labelHeadless         = v1.IsHeadlessService
)

// proxySelector selects the Services and EndpointSlices the proxy reads.
var proxySelector = func() labels.Selector {
	s, err := labels.Parse("!" + labelServiceProxyName + ",!" + labelHeadless)
	if err != nil {
		panic(err) // constant input
	}
	return s
}()

// views are the proxy's views of the process's informers: Services and
// EndpointSlices without the labels above, kept as records (records.go),
// with slices indexed by their Service for partial syncs (caches.delta);
// and this node's Node, slim (nodeKeep), or every Node when their pod
// CIDRs are the cluster's (allNodes: no --cluster-cidr). Alone in a
// process, the selectors go to the API server, as kube-proxy's do.
type views struct {
	services, slices, nodes *informer.Handle
}

func registerViews(f *informer.Factory, nodeName string, allNodes bool) views {
	self := nodeName
	if allNodes {
		self = ""
	}
	// Read whole, by key and by Service: no namespace index.
	return views{
		services: f.Register(informer.View{Kind: informer.Services, Name: "proxy", Labels: proxySelector, Record: record,
			NoNamespaceIndex: true}),
		slices: f.Register(informer.View{Kind: informer.EndpointSlices, Name: "proxy", Labels: proxySelector, Record: record,
			Indexers: cache.Indexers{byService: sliceServiceIndex}, NoNamespaceIndex: true}),
		nodes: nodeview.Register(f, nodeview.View{Feature: "proxy", Self: self, Keep: nodeKeep}),
	}
}

// nodeKeep is what the proxy reads of its Node beside its addresses: the
// zone for topology hints, and the cluster autoscaler's taint for the
// node health server.
var nodeKeep = nodeview.Keep{Labels: []string{v1.LabelTopologyZone}, Taints: []string{toBeDeletedTaint}}

// record is the views' Record: a Service's or an EndpointSlice's record.
func record(obj runtime.Object) any {
	r, _ := toRecord(obj) // never fails
	return r
}

// byService indexes slice records by "namespace/service".
const byService = "service"

func sliceServiceIndex(obj any) ([]string, error) {
	if s, ok := obj.(*sliceRecord); ok && s.service != "" {
		return []string{s.serviceKey().String()}, nil
	}
	return nil, nil
}
