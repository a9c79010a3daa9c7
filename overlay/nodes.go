package overlay

import (
	"reflect"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
)

// Nodes is a node feature's view of the Node objects, each slimmed to its
// facts (NodeOf) as the informer receives it: the node role's features
// that route pods (the overlay, the pod network) read nothing else of a
// Node, and most Node updates (kubelet heartbeats) change none of it.
type Nodes struct{ h *informer.Handle }

// nodeRecord is a Node's facts as an informer keeps them.
type nodeRecord struct{ Node }

func (r *nodeRecord) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: r.Name} }

// WatchNodes registers the view of feature (named in logs) with f; it
// must be called when the process builds its roles, before f starts.
func WatchNodes(f *informer.Factory, feature string) *Nodes {
	return &Nodes{h: f.Register(informer.View{Kind: informer.Nodes, Name: feature, Record: func(o runtime.Object) any {
		return &nodeRecord{NodeOf(o.(*v1.Node))}
	}})}
}

// OnChange calls changed whenever a Node comes, goes or changes its facts.
// Valid once the factory started.
func (n *Nodes) OnChange(changed func()) error {
	_, err := n.h.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		DeleteFunc: func(any) { changed() },
		UpdateFunc: func(o, c any) {
			if !reflect.DeepEqual(o, c) {
				changed()
			}
		},
	})
	return err
}

// Synced is done once the first list is in. Valid once the factory started.
func (n *Nodes) Synced() cache.DoneChecker { return n.h.Synced() }

// List is every Node's facts, and this node's (self) when it is among them.
func (n *Nodes) List(self string) (all []Node, me Node, found bool) {
	for _, o := range n.h.Indexer().List() {
		r, ok := o.(*nodeRecord)
		if !ok {
			continue
		}
		all = append(all, r.Node)
		if r.Name == self {
			me, found = r.Node, true
		}
	}
	return all, me, found
}
