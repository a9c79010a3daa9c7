package nodeview

import (
	"context"
	"reflect"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// Nodes is a node feature's view of the Node objects, each slimmed to its
// facts (Of) as the informer receives it, and the feature's sync loop on
// them: the features that route pods (the overlay, the pod network) read
// nothing else of a Node, and most Node updates (kubelet heartbeats)
// change none of it.
type Nodes struct {
	h        *informer.Handle
	d        role.Deps
	loop     *Loop
	relevant func(old, cur *Node) bool // nil: every change
	track    bool                      // keep the names Changed returns

	mu      sync.Mutex
	changed map[string]bool // Nodes changed since the last Changed
}

// nodeRecord is a Node's facts as an informer keeps them.
type nodeRecord struct{ Node }

func (r *nodeRecord) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: r.Name} }

// View is what a feature reads of the Nodes.
type View struct {
	Feature string // named in logs and checks
	Self    string // only the Node of this name; "" for every Node
	Keep    Keep
}

// Register registers v with the process's informer factory; the view's
// records are Nodes (RecordOf reads one). Call it when the process builds
// its roles, before the factory starts.
func Register(f *informer.Factory, v View) *informer.Handle {
	iv := informer.View{Kind: informer.Nodes, Name: v.Feature, Record: func(o runtime.Object) any {
		if n, ok := o.(*v1.Node); ok {
			return Record(n, v.Keep)
		}
		return o // already a record: transforms must be idempotent
	}}
	if v.Self != "" {
		iv.Fields = fields.OneTermEqualSelector("metadata.name", v.Self)
	}
	return f.Register(iv)
}

// Record is n as a view keeps it, for a handler or a cache: what
// RecordOf and Get read.
func Record(n *v1.Node, keep Keep) any { return &nodeRecord{Of(n, keep)} }

// Get is the Node of this name in a view's cache (its Handle's Indexer).
func Get(store cache.KeyGetter, name string) (Node, bool) {
	o, ok, err := store.GetByKey(name)
	if err != nil || !ok {
		return Node{}, false
	}
	r, ok := o.(*nodeRecord)
	if !ok {
		return Node{}, false
	}
	return r.Node, true
}

// Watch registers the view of every Node for feature (named in logs,
// checks and metrics), and makes its Loop of sync; call it when the
// process builds its roles, before the factory starts.
func Watch(d role.Deps, feature string, sync func(ctx context.Context, full bool) error) (*Nodes, error) {
	return WatchKeeping(d, feature, Keep{}, sync)
}

// WatchKeeping is Watch of a view that also keeps what keep names (the
// WireGuard public key annotation, say): a change of it wakes the loop.
func WatchKeeping(d role.Deps, feature string, keep Keep, sync func(ctx context.Context, full bool) error) (*Nodes, error) {
	l, err := NewLoop(d, feature, sync)
	if err != nil {
		return nil, err
	}
	return &Nodes{h: Register(d.Factory, View{Feature: feature, Keep: keep}), d: d, loop: l}, nil
}

// Run runs the feature's Loop until ctx ends, once the first list of
// Nodes is in: a Node that comes, goes or changes its facts requests a
// sync.
func (n *Nodes) Run(ctx context.Context) error {
	n.d.Factory.Start(ctx)
	if err := n.onChange(); err != nil {
		return err
	}
	n.loop.Run(ctx, n.h.Synced())
	return nil
}

// Request asks for a sync; it never blocks.
func (n *Nodes) Request() { n.loop.Request() }

// Relevant makes only the Node changes for which relevant is true request
// a sync: old is nil for a new Node, cur nil for a deleted one. Call it
// before Run.
func (n *Nodes) Relevant(relevant func(old, cur *Node) bool) { n.relevant = relevant }

// onChange requests a sync whenever a Node comes, goes or changes its
// facts, and the change is relevant. Valid once the factory started.
func (n *Nodes) onChange() error {
	_, err := n.h.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { n.change(nil, RecordOf(o)) },
		DeleteFunc: func(o any) { n.change(RecordOf(o), nil) },
		UpdateFunc: func(o, c any) {
			if !reflect.DeepEqual(o, c) {
				n.change(RecordOf(o), RecordOf(c))
			}
		},
	})
	return err
}

func (n *Nodes) change(old, cur *Node) {
	if n.relevant != nil && !n.relevant(old, cur) {
		return
	}
	if n.track {
		n.mu.Lock()
		if n.changed == nil {
			n.changed = map[string]bool{}
		}
		for _, r := range []*Node{old, cur} {
			if r != nil {
				n.changed[r.Name] = true
			}
		}
		n.mu.Unlock()
	}
	n.loop.Request()
}

// RecordOf is the Node an informer of a view handed to a handler; nil for
// anything else (a tombstone without its final state).
func RecordOf(o any) *Node {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if r, ok := o.(*nodeRecord); ok {
		return &r.Node
	}
	return nil
}

// TrackChanges keeps the names of changed Nodes for Changed; a feature
// that never asks leaves them unkept, so they do not pile up for the life
// of the process. Call it before Run.
func (n *Nodes) TrackChanges() { n.track = true }

// Changed are the names of the Nodes whose relevant changes requested a
// sync since the last call (with TrackChanges); a sync that takes them
// covers them.
func (n *Nodes) Changed() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.changed))
	for name := range n.changed {
		out = append(out, name)
	}
	n.changed = nil
	return out
}

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
