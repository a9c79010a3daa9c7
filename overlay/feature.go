package overlay

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nodeview"
)

// Feature is the overlay as a feature of the node role: it keeps the
// routes, tunnel devices and entries of this node's network namespace
// converged to the Node objects, logs each remote node's path when it
// changes, and warns on a Node whose pod CIDRs it cannot route (event
// PodCIDRNotRoutable, the only way it could work being another mode).
type Feature struct {
	d       role.Deps
	cfg     Config
	nodes   *nodeview.Nodes
	metrics *Metrics

	syncer   *Syncer
	recorder record.EventRecorder
	prev     []Decision // the paths of the last sync, to log changes once
}

// New builds the feature from the node's settings (its mode, and whether
// strict encryption makes it step aside) and the VXLAN port and VNI, and
// registers its metrics and its view of the Nodes; the process calls it
// before any informer starts.
func New(d role.Deps, s nodeview.Settings) (*Feature, error) {
	o := d.Config.Node.Overlay
	cfg := Config{Mode: Mode(s.Overlay), Port: int(o.VXLANPort), VNI: int(o.VXLANVNI), Off: s.OverlayOff()}.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Feature{d: d, cfg: cfg, metrics: NewMetrics()}
	var err error
	if f.nodes, err = nodeview.Watch(d, "overlay", f.sync); err != nil {
		return nil, err
	}
	f.nodes.TrackChanges()
	if err := d.Register(f.metrics.Collectors()...); err != nil {
		return nil, err
	}
	return f, nil
}

// Run converges the kernel until ctx ends. Nothing is removed on the way
// out: routes, devices and entries stay, so pod connections survive a
// restart or an upgrade of the agent.
func (f *Feature) Run(ctx context.Context) error {
	h, err := link.Open()
	if err != nil {
		return err
	}
	defer h.Close()
	if f.syncer, err = NewSyncer(h, f.cfg, f.metrics); err != nil {
		return err
	}
	// Events name the Node, as the node agent of this node (kubelet's
	// convention: a Node's UID in a reference is its name).
	var stop func()
	f.recorder, stop = f.d.Recorder("netplane-node", f.d.Config.Node.NodeName)
	defer stop()
	f.d.Log.Info("overlay starting", "mode", f.cfg.Mode, "vxlanPort", f.cfg.Port, "vxlanVNI", f.cfg.VNI, "steppedAside", f.cfg.Off)
	if err := f.nodes.Run(ctx); err != nil {
		return err
	}
	f.d.Log.Info("overlay stopped; routes, devices and entries left in place")
	return nil
}

// sync converges the kernel to the Node cache. A full sync (the first,
// each --sync-period, after a failure) reads the kernel afresh and heals
// it (Syncer.Sync); any other writes only the entries of the Nodes that
// changed (Syncer.SyncChanged).
func (f *Feature) sync(_ context.Context, full bool) error {
	self := f.d.Config.Node.NodeName
	changed := f.nodes.Changed()
	nodes, _, found := f.nodes.List(self)
	if !found {
		// Not a failure of the sync: the Node may not be registered yet.
		// The changes taken above are not applied, so the next sync must
		// plan every Node.
		f.syncer.forget()
		return nodeview.Waiting(fmt.Sprintf("node %q is not among the %d Nodes: waiting for it (or check --node-name)", self, len(nodes)))
	}
	var plan Plan
	var err error
	if full {
		plan, err = f.syncer.Sync(self, nodes)
	} else {
		plan, err = f.syncer.SyncChanged(self, nodes, changed)
	}
	f.report(plan)
	if err != nil {
		return fmt.Errorf("overlay sync: %w", err)
	}
	return nil
}

// report logs each remote node's path once per change and warns on the
// Nodes whose pod CIDRs newly get no route.
func (f *Feature) report(plan Plan) {
	for _, d := range Changed(f.prev, plan.Decisions) {
		f.d.Log.Info("path to node", "node", d.Node, "family", d.Family.String(), "path", d.Path, "reason", d.Reason)
		if d.Path != None || d.Reason == "gone" || d.Family == 0 {
			continue // a node without pod CIDRs has nothing to route yet
		}
		msg := fmt.Sprintf("%s pod CIDRs of node %s are not routed from node %s: %s", d.Family, d.Node, f.d.Config.Node.NodeName, d.Reason)
		f.recorder.Event(&v1.ObjectReference{Kind: "Node", Name: d.Node, UID: types.UID(d.Node)}, v1.EventTypeWarning, "PodCIDRNotRoutable", msg)
	}
	f.prev = plan.Decisions
}
