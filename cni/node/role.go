// Package node is the pod-networking half of the node role: it prepares the
// node for the netplane-cni plugin. Once its Node has spec.podCIDRs it keeps
// the bridge, the forwarding sysctls, the egress masquerade table, the CNI
// conflist, the installed plugin binary and the routes to other nodes' pod
// CIDRs in the desired state. Every sync recomputes all of it from the Node
// cache (level-triggered), so lost events, restarts and someone deleting a
// route or flushing the table are healed by the next sync.
package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/cni/link"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// Run is the pod-networking half of the node role.
func Run(ctx context.Context, d role.Deps) error {
	clusterCIDRs := d.Config.Node.ClusterCIDRs
	host, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer host.Close()
	// The Nodes come from a factory of this feature's own: the process's
	// factory takes views only while the node role is built, before this
	// runs.
	f := informer.New(d.Client)
	nodes := f.Register(informer.View{Kind: informer.Nodes, Name: "podnetwork"})
	f.Start(ctx)
	a := &agent{d: d, nodes: corelisters.NewNodeLister(nodes.Indexer()), clusterCIDRs: clusterCIDRs, host: host,
		offLink: map[string]bool{}, metrics: newMetrics(d.Metrics), kick: make(chan struct{}, 1),
		pluginPath: d.Config.Node.CNIPluginPath}
	if a.pluginPath == "" {
		a.pluginPath = defaultPluginPath()
	}
	if _, err := nodes.AddEventHandler(a.handler()); err != nil {
		return err
	}
	d.Checks.AddReady("podnetwork-setup", a.ready)
	if !role.WaitForSync(ctx, d, "podnetwork", nodes.Synced()) {
		return nil
	}
	a.recorder = newRecorder(ctx, d, d.Config.Node.NodeName)
	a.loop(ctx)
	return nil
}

// handler kicks a sync on Node changes that matter here: most Node updates
// are kubelet heartbeats that change neither pod CIDRs nor addresses.
func (a *agent) handler() cache.ResourceEventHandlerFuncs {
	poke := func(any) {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke,
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*v1.Node)
			nn, ok2 := n.(*v1.Node)
			if !ok1 || !ok2 || fmt.Sprint(infoOf(on)) != fmt.Sprint(infoOf(nn)) {
				poke(n)
			}
		},
	}
}

// loop syncs on every kick (at most once per --min-sync-period) and fully,
// rewriting even unchanged state, every --sync-period.
func (a *agent) loop(ctx context.Context) {
	cfg := a.d.Config.Node
	period := cfg.SyncPeriod.Duration
	if period <= 0 {
		period = 30 * time.Second
	}
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	full := true
	for {
		a.sync(full)
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
			full = false
		case <-ticker.C:
			full = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.MinSyncPeriod.Duration):
		}
	}
}

func newRecorder(ctx context.Context, d role.Deps, nodeName string) record.EventRecorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.Client.CoreV1().Events("")})
	go func() { <-ctx.Done(); b.Shutdown() }()
	return b.NewRecorder(scheme.Scheme, v1.EventSource{Component: "netplane-node", Host: nodeName})
}

type agent struct {
	d            role.Deps
	nodes        corelisters.NodeLister
	clusterCIDRs []netip.Prefix
	pluginPath   string
	host         *netlink.Handle
	recorder     record.EventRecorder
	metrics      metrics

	kick     chan struct{}
	offLink  map[string]bool // nodes last seen not on our L2 segment
	lastMasq string          // the masquerade plan last written

	mu      sync.Mutex
	lastErr error
}

func (a *agent) ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastErr
}

// sync runs one sync and logs only changes of outcome: the same error
// every period (a Node still without pod CIDRs) is said once.
func (a *agent) sync(full bool) {
	start := time.Now()
	err := a.syncOnce(full)
	a.metrics.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		a.metrics.errors.Inc()
	}
	a.mu.Lock()
	changed := fmt.Sprint(err) != fmt.Sprint(a.lastErr)
	a.lastErr = err
	a.mu.Unlock()
	switch {
	case err != nil && changed:
		a.d.Log.Error(err, "pod networking is not set up; retrying at every sync")
	case err == nil && changed:
		a.d.Log.Info("pod networking is set up")
	}
}

// syncOnce converges the node; full also rewrites the masquerade table
// when the plan is unchanged, healing a flush by someone else.
func (a *agent) syncOnce(full bool) error {
	cfg := a.d.Config.Node
	list, err := a.nodes.List(everything)
	if err != nil {
		return err
	}
	var infos []nodeInfo
	var self *nodeInfo
	for _, n := range list {
		infos = append(infos, infoOf(n))
		if n.Name == cfg.NodeName {
			self = &infos[len(infos)-1]
		}
	}
	if self == nil || len(self.PodCIDRs) == 0 {
		return fmt.Errorf("node %q has no spec.podCIDRs yet: waiting for the controller that assigns them (or check --node-name)", cfg.NodeName)
	}
	me := *self
	var errs []error
	if err := a.setUpNode(me); err != nil {
		return err // no conflist before the bridge and forwarding are in place
	}
	if plan := planMasquerade(me, a.clusterCIDRs, infos); full || fmt.Sprint(plan) != a.lastMasq {
		if err := programMasquerade(plan); err != nil {
			errs = append(errs, err)
		} else {
			a.lastMasq = fmt.Sprint(plan)
		}
	}
	errs = append(errs, a.writeCNIFiles(me), a.syncRoutes(infos))
	return errors.Join(errs...)
}

func (a *agent) setUpNode(me nodeInfo) error {
	cfg := a.d.Config.Node
	var gws []netip.Prefix
	for _, p := range me.PodCIDRs {
		gws = append(gws, netip.PrefixFrom(p.Addr().Next(), p.Bits()))
	}
	if _, err := link.EnsureBridge(a.host, cfg.Bridge, a.mtu(), gws); err != nil {
		return err
	}
	sysctls := [][2]string{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/" + cfg.Bridge + "/route_localnet", "1"}}
	for _, p := range me.PodCIDRs {
		if p.Addr().Is6() {
			sysctls = append(sysctls, [2]string{"net/ipv6/conf/all/forwarding", "1"})
		}
	}
	for _, s := range sysctls {
		if err := link.SysctlIn(cfg.ProcSysDir, s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

func (a *agent) mtu() int {
	if m := a.d.Config.Node.MTU; m > 0 {
		return int(m)
	}
	return link.DefaultRouteMTU(a.host)
}

func (a *agent) writeCNIFiles(me nodeInfo) error {
	cfg := a.d.Config.Node
	dst := filepath.Join(cfg.CNIBinDir, "netplane-cni")
	if wrote, err := installPlugin(a.pluginPath, dst); err != nil {
		return err
	} else if wrote {
		a.d.Log.Info("installed the CNI plugin", "from", a.pluginPath, "to", dst)
	}
	conf := renderConflist(conflistOpts{PodCIDRs: me.PodCIDRs, Bridge: cfg.Bridge, MTU: a.mtu(), StateDir: cfg.IPAMStateDir})
	path := filepath.Join(cfg.CNIConfDir, ConflistName)
	wrote, err := writeAtomic(path, conf, 0o644)
	if wrote {
		a.d.Log.Info("wrote the CNI configuration", "path", path, "podCIDRs", me.PodCIDRs)
	}
	return err
}

// syncRoutes routes other nodes' pod CIDRs to them, host-gw style. A node
// whose address is reachable only through a gateway cannot be a next hop:
// it is reported (event and log, once per change) instead of routed.
func (a *agent) syncRoutes(infos []nodeInfo) error {
	var want []route
	for _, r := range desiredRoutes(a.d.Config.Node.NodeName, infos) {
		ok, err := onLink(a.host, r.Via)
		if err == nil && ok {
			want = append(want, r)
			if a.offLink[r.Node] {
				delete(a.offLink, r.Node)
				a.d.Log.Info("node is on our L2 segment again", "node", r.Node, "address", r.Via)
			}
			continue
		}
		if !a.offLink[r.Node] {
			a.offLink[r.Node] = true
			msg := fmt.Sprintf("pod CIDR %s of node %s is not routed: its address %s is not on this node's L2 segment (%v); netplane routes pods host-gw style and needs the nodes on one segment", r.Dst, r.Node, r.Via, err)
			a.d.Log.Info(msg)
			a.recorder.Event(&v1.ObjectReference{Kind: "Node", Name: r.Node, UID: typesUID(r.Node)}, v1.EventTypeWarning, "PodCIDRNotRoutable", msg)
		}
	}
	a.metrics.routes.Set(float64(len(want)))
	a.metrics.offLink.Set(float64(len(a.offLink)))
	return syncRoutes(a.host, want)
}
