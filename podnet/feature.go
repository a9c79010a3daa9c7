// Package podnet is the pod network of the node role: it prepares the node
// for the netplane-cni plugin. Once its Node has spec.podCIDRs it keeps the
// bridge (with the pod MTU), the forwarding and bridge-netfilter sysctls,
// the egress masquerade table, the CNI conflist and the installed plugin
// binary in the desired state. Every sync recomputes all of it from the
// Node cache (level-triggered), so lost events, restarts and someone
// flushing the table are healed by the next sync.
//
// Routes to other nodes' pods are not here: they are the overlay's
// (package overlay), a feature of its own beside this one. What the two
// share is in package nodeview: the Node view, and the node's settings,
// which decide the pod MTU and the cluster's pod CIDRs the masquerade
// exempts.
package podnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/netplane/netplane/cni/conflist"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// Feature is the pod network as a feature of the node role.
type Feature struct {
	d          role.Deps
	settings   nodeview.Settings
	nodes      *nodeview.Nodes
	pluginPath string
	kernel     kernel     // the node's, once Run opened it
	masq       nft.Syncer // the masquerade table's
	// pluginStamp is stampOf the plugin and its installed copy when they
	// were last found equal; "" when not.
	pluginStamp string
}

// New builds the feature and registers its metrics and its view of the
// Nodes; the process calls it before any informer starts.
func New(d role.Deps, s nodeview.Settings) (*Feature, error) {
	cfg := d.Config.Node
	f := &Feature{d: d, settings: s, pluginPath: cfg.CNIPluginPath, masq: nft.NewProgrammer(nft.Dialer{}, MasqTable)}
	if f.pluginPath == "" {
		f.pluginPath = defaultPluginPath()
	}
	var err error
	if f.nodes, err = nodeview.Watch(d, "podnet", f.sync); err != nil {
		return nil, err
	}
	f.nodes.Relevant(func(old, cur *nodeview.Node) bool { return relevant(cfg.NodeName, s, old, cur) })
	return f, nil
}

// relevant says whether a Node change can change what the pod network
// writes: any change of this node's Node (its pod CIDRs, its addresses
// for the MTU); of another node's, a change of the cluster's pod CIDRs the
// masquerade exempts. Old is nil for a new Node, cur nil for a deleted one.
func relevant(self string, s nodeview.Settings, old, cur *nodeview.Node) bool {
	for _, n := range []*nodeview.Node{old, cur} {
		if n != nil && n.Name == self {
			return true
		}
	}
	return s.ClusterCIDRsChange(old, cur)
}

// Run keeps the node set up until ctx ends. A stop leaves everything in
// place: pods keep their network while the agent is restarted.
func (f *Feature) Run(ctx context.Context) error {
	h, err := link.Open()
	if err != nil {
		return err
	}
	defer h.Close()
	defer f.masq.Close()
	f.kernel = newHostKernel(h, f.d.Config.Node.ProcSysDir)
	return f.nodes.Run(ctx)
}

// sync converges the node; full also reads back the masquerade table
// when someone else changed it, healing a flush.
func (f *Feature) sync(_ context.Context, full bool) error {
	cfg := f.d.Config.Node
	nodes, me, found := f.nodes.List(cfg.NodeName)
	if !found || len(me.PodCIDRs) == 0 {
		return nodeview.Waiting(fmt.Sprintf("node %q has no spec.podCIDRs yet: waiting for the controller that assigns them (or check --node-name)", cfg.NodeName))
	}
	underlay, err := nodeview.UnderlayMTU(f.kernel, me)
	if err != nil {
		return err
	}
	mtu := f.settings.PodMTU(underlay, me)
	if err := setUpNode(f.kernel, cfg.Bridge, cfg.ProcSysDir, mtu, me.PodCIDRs); err != nil {
		return err // no conflist before the bridge and forwarding are in place
	}
	return errors.Join(f.syncMasquerade(me, nodes, full), f.writeCNIFiles(me.PodCIDRs, mtu, full))
}

// syncMasquerade converges the masquerade table through its syncer, which
// sends only what differs from what it wrote; full also reads the table
// back when someone else changed it, and repairs it.
func (f *Feature) syncMasquerade(me nodeview.Node, nodes []nodeview.Node, full bool) error {
	t := masqueradeTable(masqPlan{Sources: me.PodCIDRs, Exempt: f.settings.ClusterCIDRs(nodes)})
	if _, err := f.masq.Sync(t, full); err != nil {
		return fmt.Errorf("masquerade table %s: %w", MasqTable, err)
	}
	return nil
}

// writeCNIFiles installs the plugin and writes the conflist. The plugin's
// content is compared (a checksum of both files) on full syncs, and on
// others only when either file's size, time or inode differs from the
// last comparison: hashing the binary on every Node event is most of a
// sync's cost.
func (f *Feature) writeCNIFiles(podCIDRs []netip.Prefix, mtu int, full bool) error {
	cfg := f.d.Config.Node
	dst := filepath.Join(cfg.CNIBinDir, conflist.Type)
	if stamp := stampOf(f.pluginPath, dst); full || stamp == "" || stamp != f.pluginStamp {
		f.pluginStamp = ""
		if wrote, err := installPlugin(f.pluginPath, dst); err != nil {
			return err
		} else if wrote {
			f.d.Log.Info("installed the CNI plugin", "from", f.pluginPath, "to", dst)
		}
		f.pluginStamp = stampOf(f.pluginPath, dst)
	}
	conf := renderConflist(conflistOpts{PodCIDRs: podCIDRs, Bridge: cfg.Bridge, MTU: mtu, StateDir: cfg.IPAMStateDir})
	path := filepath.Join(cfg.CNIConfDir, ConflistName)
	wrote, err := writeAtomic(path, conf, 0o644)
	if wrote {
		f.d.Log.Info("wrote the CNI configuration", "path", path, "podCIDRs", podCIDRs, "mtu", mtu)
	}
	return err
}
