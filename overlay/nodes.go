package overlay

import (
	"context"
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/runner"
)

// Nodes is a node feature's view of the Node objects, each slimmed to its
// facts (NodeOf) as the informer receives it, and the feature's sync loop
// on them: the node role's features that route pods (the overlay, the pod
// network) read nothing else of a Node, and most Node updates (kubelet
// heartbeats) change none of it.
type Nodes struct {
	h       *informer.Handle
	d       role.Deps
	feature string
	runner  *runner.Runner
}

// nodeRecord is a Node's facts as an informer keeps them.
type nodeRecord struct{ Node }

func (r *nodeRecord) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: r.Name} }

// WatchNodes registers the view of feature (named in logs and checks) with
// the process's informer factory, and makes its sync loop of sync with
// --min-sync-period and --sync-period; it must be called when the process
// builds its roles, before the factory starts.
func WatchNodes(d role.Deps, feature string, sync func(ctx context.Context, full bool) error) *Nodes {
	h := d.Factory.Register(informer.View{Kind: informer.Nodes, Name: feature, Record: func(o runtime.Object) any {
		return &nodeRecord{NodeOf(o.(*v1.Node))}
	}})
	n := d.Config.Node
	r := runner.New(sync, runner.Options{MinInterval: n.MinSyncPeriod.Duration, FullInterval: n.SyncPeriod.Duration})
	return &Nodes{h: h, d: d, feature: feature, runner: r}
}

// Run runs the feature's sync loop until ctx ends, once the first list of
// Nodes is in (until then /readyz names the feature as not ready): a Node
// that comes, goes or changes its facts requests a sync, and /healthz
// fails when a request waits longer than twice --sync-period to be synced,
// as kube-proxy's health check does.
func (n *Nodes) Run(ctx context.Context) error {
	n.d.Factory.Start(ctx)
	if err := n.onChange(n.runner.Request); err != nil {
		return err
	}
	limit := time.Minute
	if p := n.d.Config.Node.SyncPeriod.Duration; p > 0 {
		limit = 2 * p
	}
	n.d.Checks.AddHealth(n.feature, func() error { return n.runner.Healthy(limit) })
	if !role.WaitForSync(ctx, n.d, n.feature, n.h.Synced()) {
		return nil
	}
	n.runner.Run(ctx)
	return nil
}

// onChange calls changed whenever a Node comes, goes or changes its facts.
// Valid once the factory started.
func (n *Nodes) onChange(changed func()) error {
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
