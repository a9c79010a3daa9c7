package wireguard

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/sweep"
)

// Feature is WireGuard as a feature of the node role. With encryption on
// it keeps this node's key and its annotation, the device and its peers,
// the routes of every other node's pod CIDRs into the device and the guard
// table converged to the Node objects. With encryption off it removes the
// device and the guard table once, so that the overlay's paths take over.
type Feature struct {
	d        role.Deps
	settings nodeview.Settings
	on       bool
	nodes    *nodeview.Nodes
	metrics  *Metrics

	h        *netlink.Handle
	key      wgtypes.Key
	dev      Device
	syncer   *Syncer
	guard    *nft.Programmer
	recorder record.EventRecorder
	rejected []Rejected // of the last sync, to warn once per node

	shakes  *handshakes // permissive: the peers not yet routed, waiting for a handshake
	leaving *time.Timer // asks for the sync that removes peers whose Linger is over
	waiting []string    // their nodes as last logged

	mu     sync.Mutex
	last   Plan   // of the last sync, for the metrics between syncs
	opened Device // f.dev once open, for the metrics between syncs
}

// refreshEvery is how often the peers' handshakes and bytes are read for
// the metrics between syncs.
const refreshEvery = 5 * time.Second

// New builds the feature and registers its metrics and, with encryption
// on, its view of the Nodes (with the key annotation); the process calls
// it before any informer starts.
func New(d role.Deps, s nodeview.Settings) (*Feature, error) {
	f := &Feature{d: d, settings: s, on: s.Encryption != nodeview.NoEncryption, metrics: NewMetrics()}
	if !f.on {
		return f, nil
	}
	var err error
	if f.nodes, err = nodeview.WatchKeeping(d, "wireguard", nodeview.Keep{Annotations: []string{Annotation}}, f.sync); err != nil {
		return nil, err
	}
	dropped := func(chain string) func() float64 {
		return func() float64 {
			if f.guard == nil {
				return 0
			}
			n, err := f.guard.Packets(chain)
			if err != nil {
				return 0
			}
			return float64(n[chain])
		}
	}
	cs := f.metrics.Collectors()
	for reason, chain := range map[string]string{"no-key": ChainNoKey, "clear": ChainClear} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "netplane_wireguard_dropped_packets_total",
			Help:        "Packets to pod CIDRs dropped rather than sent in clear, by reason: no-key (a node that is not a peer), clear (about to leave by another interface than the tunnel).",
			ConstLabels: prometheus.Labels{"reason": reason}}, dropped(chain)))
	}
	if err := d.Register(cs...); err != nil {
		return nil, err
	}
	return f, nil
}

// Run converges until ctx ends. On the way out the kernel's device stays
// with its peers; of the userspace one its persistent TUN device stays,
// with the routes into it, dropping pod traffic until the next agent opens
// it, and the guard table stays too.
func (f *Feature) Run(ctx context.Context) error {
	h, err := link.Open()
	if err != nil {
		return err
	}
	defer h.Close()
	f.h = h
	if !f.on {
		if !nodeview.Await(ctx, f.d) {
			return nil
		}
		return f.remove(ctx)
	}
	wg := f.settings.WireGuard
	key, created, err := LoadOrCreateKey(wg.PrivateKeyFile)
	if err != nil {
		return err
	}
	f.key = key
	f.d.Log.Info("WireGuard key", "file", wg.PrivateKeyFile, "created", created, "publicKey", key.PublicKey().String())
	f.guard = nft.NewProgrammer(nft.Dialer{}, GuardTable)
	defer f.guard.Close()
	var stop func()
	f.recorder, stop = f.d.Recorder("netplane-node", f.d.Config.Node.NodeName)
	defer stop()
	defer f.stop()
	go f.refresh(ctx)
	f.shakes = newHandshakes(f.readOpened, f.nodes.Request)
	go f.shakes.run(ctx)
	defer func() {
		if f.leaving != nil {
			f.leaving.Stop()
		}
	}()
	if f.settings.ClusterCIDRsFromNodes() {
		f.d.Log.Info("no --cluster-cidr: the pod CIDRs guarded against leaving in clear are the Nodes' only, not those of nodes yet to come")
	}
	return f.nodes.Run(ctx)
}

// stop lets go of the device as the feature stops. The userspace one
// goes on running in the agent's keeping (Deps.Keeper) until the next
// agent claims it or this one exits: a data path in this process would
// otherwise stop between this feature's end and the next agent's first
// sync; and a next agent that runs without encryption claims nothing, so
// this device serves the peers that still send through it while they
// follow the key's removal.
func (f *Feature) stop() {
	if f.dev == nil {
		return
	}
	if u, ok := f.dev.(*UserspaceDevice); ok && f.d.Keeper != nil {
		f.d.Keeper.Keep(parcel, u)
		return
	}
	f.dev.Close()
}

// parcel is the name the userspace device is kept and claimed under.
const parcel = "wireguard"

// remove undoes encryption: first the key annotation, so that peers in
// permissive mode send to this node by the overlay again; then the routing
// table, its rules and the guard table, so that this node's own pod
// traffic takes the overlay's routes at once (the userspace device may
// have no process reading it any more: the agent that ran it handed the
// node over); and once peers had a moment to follow, the device.
func (f *Feature) remove(ctx context.Context) error {
	unpublished := f.unpublish(ctx)
	var s sweep.Sweep
	removeRouting(&s, f.h)
	s.Table(GuardTable)
	if unpublished {
		select {
		case <-ctx.Done():
		case <-time.After(peersFollow):
		}
	}
	s.Link(f.h, DeviceName, "")
	for _, what := range s.Removed() {
		f.d.Log.Info("encryption is off: removed " + what)
	}
	return s.Err()
}

// unpublish removes this node's key annotation, and says whether it did.
func (f *Feature) unpublish(ctx context.Context) bool {
	self := f.d.Config.Node.NodeName
	n, err := f.d.Client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
	if err != nil || n.Annotations[Annotation] == "" {
		return false
	}
	patch := []byte(`{"metadata":{"annotations":{"` + Annotation + `":null}}}`)
	if _, err := f.d.Client.CoreV1().Nodes().Patch(ctx, self, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "netplane-wireguard"}); err != nil {
		// Not fatal: peers in strict mode drop to this node either way,
		// and the node's own paths do not depend on it.
		f.d.Log.Error(err, "encryption is off but the WireGuard key annotation stays: peers in permissive mode keep sending through WireGuard to this node, which drops it; allow the node role to patch Nodes (chart: encryption.permissive=true) or remove the annotation", "node", self, "annotation", Annotation)
		return false
	}
	f.d.Log.Info("encryption is off: removed the WireGuard public key annotation", "node", self)
	return true
}

// peersFollow is how long peers are given to follow a change of this
// node's key annotation: a Node watch event and one sync.
const peersFollow = time.Second

// peerLinger is how long a peer stays in the device after it left the
// plan: what its node sent through the tunnel before it saw the change
// itself is still taken. Its node's own removal waits peersFollow; twice
// that covers a loaded node's sync.
const peerLinger = 2 * peersFollow

// sync converges to the Node cache: the device's peers (Syncer: in full
// at start and every --sync-period, else only what changed), this node's
// annotation, the routes into the device and the guard table.
func (f *Feature) sync(ctx context.Context, full bool) error {
	self := f.d.Config.Node.NodeName
	all, me, found := f.nodes.List(self)
	if !found {
		return nodeview.Waiting(fmt.Sprintf("node %q is not among the %d Nodes: waiting for it (or check --node-name)", self, len(all)))
	}
	underlay, ok := me.WireGuardUnderlay()
	if !ok {
		return nodeview.Waiting(fmt.Sprintf("node %q has no InternalIP yet: waiting for it", self))
	}
	if f.dev == nil {
		if err := f.open(ctx, me, underlay); err != nil {
			return err
		}
		full = true
	}
	cluster := f.settings.ClusterCIDRs(all)
	in := Input{Self: self, Underlay: underlay, Nodes: Facts(all)}
	plan, err := f.syncer.SyncRouted(in, full, func(plan Plan) error {
		return f.route(plan, cluster, me.PodCIDRs, full)
	})
	if at, ok := f.syncer.Leaving(); ok {
		f.remindAt(at)
	}
	f.warn(plan)
	f.observe(plan)
	if err != nil {
		return fmt.Errorf("WireGuard sync: %w", err)
	}
	// Published once the device can take what peers send on seeing it.
	return f.publish(ctx, me)
}

// publish writes this node's public key into its own Node's annotation,
// with a merge patch of that annotation only.
func (f *Feature) publish(ctx context.Context, me nodeview.Node) error {
	patch := PublishPatch(me.Annotations, f.key.PublicKey())
	if patch == nil {
		return nil
	}
	_, err := f.d.Client.CoreV1().Nodes().Patch(ctx, me.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "netplane-wireguard"})
	if err != nil {
		return fmt.Errorf("publish the WireGuard public key on node %s: %w", me.Name, err)
	}
	f.d.Log.Info("published the WireGuard public key", "node", me.Name, "annotation", Annotation)
	return nil
}

// open makes the device, of the node's pod MTU; or, taking the node over
// from an agent that ran the userspace one, carries on with its TUN
// device's file.
func (f *Feature) open(ctx context.Context, me nodeview.Node, underlay netip.Addr) error {
	under, err := nodeview.UnderlayMTU(nodeview.KernelUnderlay(f.h), me)
	if err != nil {
		return err
	}
	mtu, wg := f.settings.PodMTU(under, me), f.settings.WireGuard
	var dev Device
	impl := Userspace
	if handed := f.claim(ctx); len(handed) > 0 && wg.Implementation != Kernel {
		dev, err = OpenUserspaceFrom(handed, mtu, wg.Port, f.d.Log)
	} else {
		for _, h := range handed {
			h.Close()
		}
		dev, impl, err = Open(wg.Implementation, DeviceName, mtu, wg.Port, f.d.Log)
	}
	if err != nil {
		return err
	}
	f.d.Log.Info("WireGuard device up", "device", DeviceName, "implementation", impl, "mtu", mtu, "port", wg.Port, "underlay", underlay)
	f.metrics.Running(impl)
	f.dev, f.syncer = dev, NewSyncer(dev, f.key, wg.Port)
	f.syncer.Linger = peerLinger
	f.mu.Lock()
	f.opened = dev
	f.mu.Unlock()
	return nil
}

// claim is the running agent's userspace device (its TUN file and relay)
// when this agent took the node over from it; nil otherwise.
func (f *Feature) claim(ctx context.Context) []*os.File {
	if f.d.Takeover == nil {
		return nil
	}
	handed, err := f.d.Takeover.Claim(ctx, parcel)
	if err != nil {
		f.d.Log.Error(err, "claiming the running agent's WireGuard device: opening it anew")
	}
	if handed != nil {
		f.d.Log.Info("carrying on with the WireGuard device the running agent handed over")
	}
	return handed
}

// route writes the routes into the device and, when strict, the guard
// table (read back on full syncs only); permissive, the guard table goes.
// cluster are the cluster's pod CIDRs, podCIDRs this node's.
func (f *Feature) route(plan Plan, cluster, podCIDRs []netip.Prefix, full bool) error {
	strict := f.settings.Encryption == nodeview.WireGuardStrict
	if strict {
		if _, err := f.guard.Sync(Guard(plan.Drop, cluster, f.d.Config.Node.Bridge), full); err != nil {
			return fmt.Errorf("guard table %s: %w", GuardTable, err)
		}
	} else if full {
		if err := nft.Delete(nft.Dialer{}, GuardTable); err != nil {
			return err
		}
	}
	l, err := f.h.LinkByName(DeviceName)
	if err != nil {
		return fmt.Errorf("find %s: %w", DeviceName, err)
	}
	table, err := tableRoutes(f.h)
	if err != nil {
		return err
	}
	if !strict {
		var waiting []Peer
		plan.Peers, waiting = f.handshaken(plan.Peers, table)
		f.shakes.wait(waiting)
		f.tellWaiting(waiting)
	}
	own := DeviceAddrs(podCIDRs)
	return syncLink(f.h, l, own, table, Routes(plan, cluster, podCIDRs, own, strict))
}

// handshaken splits peers into those to route and those that wait for
// their first handshake (permissive.go), table being the routes in the
// table now; the device is read only when a peer's routes are not all in
// the table yet.
func (f *Feature) handshaken(peers []Peer, table map[netip.Prefix]netlink.Route) (routed, waiting []Peer) {
	inTable := func(p netip.Prefix) bool { _, ok := table[p]; return ok }
	var done func(wgtypes.Key) bool
	handshaken := func(k wgtypes.Key) bool {
		if done == nil {
			done = func(wgtypes.Key) bool { return false }
			if dev, err := f.dev.Device(); err == nil {
				done = Handshaken(dev)
			}
		}
		return done(k)
	}
	return Routed(peers, inTable, handshaken)
}

// tellWaiting logs the peers waiting for their first handshake when they
// change.
func (f *Feature) tellWaiting(waiting []Peer) {
	names := make([]string, 0, len(waiting))
	for _, p := range waiting {
		names = append(names, p.Node)
	}
	if slices.Equal(names, f.waiting) {
		return
	}
	f.waiting = names
	if len(names) > 0 {
		f.d.Log.Info("permissive: these peers are sent to in clear until a first handshake with them (they may not know this node's key yet)", "nodes", names)
	}
}

// readOpened reads the device once open.
func (f *Feature) readOpened() (*wgtypes.Device, error) {
	f.mu.Lock()
	d := f.opened
	f.mu.Unlock()
	if d == nil {
		return nil, fmt.Errorf("no WireGuard device yet")
	}
	return d.Device()
}

// warn writes one Warning event per node newly rejected.
func (f *Feature) warn(plan Plan) {
	for _, r := range NewlyRejected(f.rejected, plan.Rejected) {
		f.d.Log.Info("node is not a WireGuard peer: its pod traffic is dropped", "node", r.Node, "reason", r.Reason, "detail", r.Detail)
		f.recorder.Event(&v1.ObjectReference{Kind: "Node", Name: r.Node, UID: types.UID(r.Node)}, v1.EventTypeWarning, "WireGuard"+string(r.Reason), r.Detail)
	}
	f.rejected = plan.Rejected
}

func (f *Feature) observe(plan Plan) {
	f.mu.Lock()
	f.last = plan
	f.mu.Unlock()
	f.read(plan)
}

// read records the device's statistics with plan's rejections.
func (f *Feature) read(plan Plan) {
	f.mu.Lock()
	d := f.opened
	f.mu.Unlock()
	if d == nil {
		return
	}
	dev, err := d.Device()
	if err != nil {
		f.d.Log.Error(err, "read the WireGuard device for metrics")
		return
	}
	now := time.Now()
	f.metrics.Observe(StatsOf(dev, plan, now))
}

// refresh reads the device for the metrics between syncs until ctx ends:
// handshakes and bytes change without any Node changing.
func (f *Feature) refresh(ctx context.Context) {
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.mu.Lock()
			plan := f.last
			f.mu.Unlock()
			f.read(plan)
		}
	}
}

// Facts are the facts of nodes (from a Node view keeping Annotation)
// the plan reads.
func Facts(nodes []nodeview.Node) []Node {
	out := make([]Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, Node{Name: n.Name, IPs: n.IPs, PodCIDRs: n.PodCIDRs, Key: n.Annotations[Annotation]})
	}
	return out
}

// remindAt asks for a sync at at, when a peer's Linger is over.
func (f *Feature) remindAt(at time.Time) {
	if f.leaving == nil {
		f.leaving = time.AfterFunc(time.Until(at), f.nodes.Request)
		return
	}
	f.leaving.Reset(time.Until(at))
}
