package kit

import (
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
)

// Source is one resource as a controller reads it: a cache of whole API
// objects with its indexes, and its events. A view of the process's
// informers (*informer.Handle) is one, once the factory started; a test
// hands in caches it fills itself.
type Source interface {
	Indexer() cache.Indexer
	AddEventHandler(cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error)
}

// Sources are the resources the two controllers read.
type Sources struct {
	Services, Pods, Nodes, Endpoints, EndpointSlices Source
}

// Views are the controllers' views of the process's informers: whole
// objects of every resource they read, one view per resource shared by
// both controllers.
type Views struct {
	Services, Pods, Nodes, Endpoints, EndpointSlices *informer.Handle
}

// RegisterViews registers the controllers' views on f, with indexers by
// resource (the controllers' own indexes). It must run before f starts
// these resources: when the process builds the role.
func RegisterViews(f *informer.Factory, indexers map[informer.Kind]cache.Indexers) Views {
	view := func(k informer.Kind) *informer.Handle {
		return f.Register(informer.View{Kind: k, Name: "controller", Indexers: indexers[k]})
	}
	return Views{
		Services:       view(informer.Services),
		Pods:           view(informer.Pods),
		Nodes:          view(informer.Nodes),
		Endpoints:      view(informer.Endpoints),
		EndpointSlices: view(informer.EndpointSlices),
	}
}

// Sources are the views as the controllers read them; valid once the
// factory started.
func (v Views) Sources() Sources {
	return Sources{Services: v.Services, Pods: v.Pods, Nodes: v.Nodes, Endpoints: v.Endpoints, EndpointSlices: v.EndpointSlices}
}

// Synced are done once every view has its first list; valid once the
// factory started.
func (v Views) Synced() []cache.DoneChecker {
	return []cache.DoneChecker{v.Services.Synced(), v.Pods.Synced(), v.Nodes.Synced(), v.Endpoints.Synced(), v.EndpointSlices.Synced()}
}
