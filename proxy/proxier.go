package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/internal/runner"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// proxier is the level-triggered sync loop: any event marks the state dirty,
// and a sync recomputes the desired tables from the views' caches.
type proxier struct {
	log      logr.Logger
	cfg      v1alpha1.Node
	services cache.Store                    // of *serviceRecord
	slices   cache.Indexer                  // of *sliceRecord, indexed byService
	nodes    cache.KeyGetter                // this node's Node, slim (nodeview)
	syncers  map[nodeview.Family]nft.Syncer // the tables, by family
	model    *Model
	health   *healthServers
	metrics  *metrics
	// runner decides when sync runs: kube-proxy's --min-sync-period and
	// --sync-period (newRunner).
	runner *runner.Runner
	// cleanUDP deletes stale UDP conntrack entries (cleanConntrack).
	cleanUDP func(before, now map[netip.AddrPort]map[netip.AddrPort]bool) (uint, error)

	mu       sync.Mutex
	pending  int         // changes not yet programmed
	triggers []time.Time // endpoint change trigger times not yet programmed
	// dirty names the Services changed since the last sync; nil means
	// anything may have (before the first sync, after a Node event or a
	// failed sync).
	dirty    map[types.NamespacedName]bool
	started  time.Time // earlier trigger times are not this proxier's latency
	synced   bool      // a sync succeeded
	syncedAt time.Time // when one last did
	lastUDP  map[netip.AddrPort]map[netip.AddrPort]bool
}

// newProxier reads Services, EndpointSlices and this node's Node from the
// proxy's views and programs its tables through syncers.
func newProxier(d role.Deps, v views, m *metrics, syncers map[nodeview.Family]nft.Syncer) *proxier {
	p := &proxier{
		log:      d.Log,
		cfg:      d.Config.Node,
		services: v.services.Indexer(),
		slices:   v.slices.Indexer(),
		nodes:    v.nodes.Indexer(),
		syncers:  syncers,
		model:    NewModel(),
		metrics:  m,
		started:  time.Now(),
		cleanUDP: cleanConntrack,
	}
	p.runner = p.newRunner()
	p.health = newHealthServers(d.Log, func() bool { return p.healthz() == nil })
	return p
}

// newRunner is the proxier's runner: partial syncs at most one per
// --min-sync-period on average with bursts of two, a full sync every
// --sync-period, a failed sync retried as a full one a second later.
func (p *proxier) newRunner() *runner.Runner {
	return runner.New(p.runSync, runner.Options{
		MinInterval:  p.cfg.MinSyncPeriod.Duration,
		FullInterval: p.cfg.SyncPeriod.Duration,
		RetryAfter:   time.Second,
	})
}

func (p *proxier) close() {
	for _, s := range p.syncers {
		s.Close()
	}
}

// changed records a change and asks for a sync.
func (p *proxier) changed(obj any) { p.changedFrom(nil, obj) }

// changedFrom records a change from old (nil if unknown) to obj: the
// Services both name are dirty (a slice may move to another Service).
func (p *proxier) changedFrom(old, obj any) {
	p.mu.Lock()
	p.markDirty(old)
	p.markDirty(obj)
	p.pending++
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	// As kube-proxy: a deleted slice's trigger time counts too, and one
	// from before the proxier started (the initial list's) does not.
	if s, ok := obj.(*sliceRecord); ok && s.trigger.After(p.started) {
		p.triggers = append(p.triggers, s.trigger)
	}
	p.metrics.pendingChanges.Set(float64(p.pending))
	p.mu.Unlock()
	p.runner.Request()
}

// markDirty notes the Service obj is or belongs to; anything else (a
// Node) makes everything dirty. Called with mu held.
func (p *proxier) markDirty(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case nil:
	case *serviceRecord:
		if p.dirty != nil {
			p.dirty[o.key()] = true
		}
	case *sliceRecord:
		if p.dirty != nil && o.service != "" {
			p.dirty[o.serviceKey()] = true
		}
	default:
		p.dirty = nil
	}
}

func (p *proxier) eventHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    p.changed,
		UpdateFunc: p.changedFrom,
		DeleteFunc: p.changed,
	}
}

// nodeHandler reacts to this node only (its addresses and zone), and only
// to a change of what the proxy reads of it: not to kubelet heartbeats.
func (p *proxier) nodeHandler() cache.ResourceEventHandler {
	own := func(obj any) bool {
		n := nodeview.RecordOf(obj)
		return n != nil && n.Name == p.cfg.NodeName
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if own(obj) {
				p.changed(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			if own(obj) && !reflect.DeepEqual(old, obj) {
				p.changedFrom(old, obj)
			}
		},
		DeleteFunc: func(obj any) {
			if own(obj) {
				p.changed(obj)
			}
		},
	}
}

// healthz fails, as kube-proxy's does, when a change has waited for
// programming longer than twice the sync period.
func (p *proxier) healthz() error { return p.runner.Healthy(2 * p.cfg.SyncPeriod.Duration) }

// lastSynced is when a sync last succeeded; zero before the first.
func (p *proxier) lastSynced() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.syncedAt
}

// run syncs until ctx ends, as the runner decides.
func (p *proxier) run(ctx context.Context) { p.runner.Run(ctx) }

// runSync is one sync as the runner runs it.
func (p *proxier) runSync(_ context.Context, full bool) error {
	err := p.sync(full)
	memory.EndStartupHeadroom() // the first sync is over, well or not
	if err != nil {
		p.log.Error(err, "sync failed; retrying with a full sync")
		p.metrics.syncFailures.Inc()
	}
	return err
}

// sync programs the current state. Changes arriving meanwhile stay pending.
func (p *proxier) sync(full bool) error {
	start := time.Now()
	p.mu.Lock()
	triggers, dirty := p.triggers, p.dirty
	p.triggers, p.pending = nil, 0
	p.dirty = map[types.NamespacedName]bool{}
	p.metrics.pendingChanges.Set(0)
	p.mu.Unlock()

	// A partial sync reads only the Services changed since the last one,
	// unless the node's facts changed or a Node event came (they change
	// every Service's rules).
	var d *Desired
	node := p.nodeFacts()
	if !full && dirty != nil && p.model.Built(node) {
		if changes, err := p.delta(dirty); err == nil {
			d = p.model.Apply(changes)
		} else {
			p.log.Error(err, "reading the changed Services; reading all of them instead")
		}
	}
	if d == nil {
		in, err := p.input(node)
		if err != nil {
			p.mu.Lock()
			p.dirty = nil
			p.mu.Unlock()
			return err
		}
		d = p.model.Build(in)
	}
	touched := p.model.TakeTouched()
	built := time.Now()
	var errs []error
	for _, fam := range nodeview.Families {
		var err error
		if full || touched == nil {
			_, err = p.syncers[fam].Sync(d.Tables[fam], full)
		} else {
			_, err = p.syncers[fam].SyncTouched(d.Tables[fam], touched[fam])
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		p.mu.Lock()
		p.dirty = nil // the retry is a full sync anyway
		p.triggers = append(p.triggers, triggers...)
		p.mu.Unlock()
		return err
	}
	p.afterSync(d, full, start, built, triggers)
	return nil
}

func (p *proxier) afterSync(d *Desired, full bool, start, built time.Time, triggers []time.Time) {
	kind := "partial"
	if full {
		kind = "full"
	}
	now := time.Now()
	// Logged before the conntrack clean-up: its time is when the kernel had
	// every rule (the proxy benchmark reads it).
	p.log.V(2).Info("synced", "type", kind, "took", now.Sub(start), "building", built.Sub(start), "programming", now.Sub(built))
	p.metrics.syncDuration.WithLabelValues(kind).Observe(now.Sub(start).Seconds())
	p.metrics.lastSync.Set(float64(now.Unix()))
	for _, t := range triggers {
		p.metrics.programming.Observe(now.Sub(t).Seconds())
	}
	p.metrics.noLocalEndpoints.WithLabelValues("internal").Set(float64(d.NoLocalInternal))
	p.metrics.noLocalEndpoints.WithLabelValues("external").Set(float64(d.NoLocalExternal))
	p.mu.Lock()
	first := !p.synced
	p.synced, p.syncedAt = true, now
	before := p.lastUDP
	p.lastUDP = d.UDP
	p.mu.Unlock()
	p.health.Sync(d.Health)
	if before == nil || udpChanged(before, d.UDP) {
		n, err := p.cleanUDP(before, d.UDP)
		if err != nil {
			p.log.Error(err, "deleting stale UDP conntrack entries")
		}
		p.metrics.conntrackDeletions.Add(float64(n))
	}
	if first {
		if err := setConntrackTimeouts(p.cfg.ProcSysDir, p.cfg.Conntrack); err != nil {
			p.log.Error(err, "setting conntrack timeouts")
		}
		// The initial lists' and the first build's garbage, back now
		// rather than over the next minutes.
		memory.ReleaseStartup()
	}
}

// delta reads the dirty Services and their slices from the caches.
func (p *proxier) delta(dirty map[types.NamespacedName]bool) (map[types.NamespacedName]Change, error) {
	out := make(map[types.NamespacedName]Change, len(dirty))
	for name := range dirty {
		key := name.String() // the caches' key and the byService index's
		var c Change
		o, ok, err := p.services.GetByKey(key)
		if err != nil {
			return nil, err
		}
		if ok {
			if c.Svc, ok = o.(*serviceRecord); !ok {
				return nil, fmt.Errorf("a %T in the Service cache", o)
			}
		}
		objs, err := p.slices.ByIndex(byService, key)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			s, ok := o.(*sliceRecord)
			if !ok {
				return nil, fmt.Errorf("a %T in the EndpointSlice cache", o)
			}
			c.Slices = append(c.Slices, s)
		}
		sortSlices(c.Slices)
		out[name] = c
	}
	return out, nil
}

// sortSlices orders a Service's slices by name: the caches list them in
// no order, and the model takes a different order for a change.
func sortSlices(ss []*sliceRecord) {
	if len(ss) > 1 {
		slices.SortFunc(ss, func(a, b *sliceRecord) int { return strings.Compare(a.name, b.name) })
	}
}

// input gathers the informer caches, with this node's facts.
func (p *proxier) input(node NodeFacts) (Input, error) {
	in := Input{Slices: map[types.NamespacedName][]*sliceRecord{}, Node: node}
	for _, o := range p.services.List() {
		s, ok := o.(*serviceRecord)
		if !ok {
			return Input{}, fmt.Errorf("a %T in the Service cache", o)
		}
		in.Services = append(in.Services, s)
	}
	for _, o := range p.slices.List() {
		s, ok := o.(*sliceRecord)
		if !ok {
			return Input{}, fmt.Errorf("a %T in the EndpointSlice cache", o)
		}
		if s.service != "" {
			in.Slices[s.serviceKey()] = append(in.Slices[s.serviceKey()], s)
		}
	}
	for _, ss := range in.Slices {
		sortSlices(ss)
	}
	return in, nil
}

func (p *proxier) nodeFacts() NodeFacts {
	nf := NodeFacts{Name: p.cfg.NodeName, MasqueradeAll: p.cfg.MasqueradeAll}
	nf.ClusterCIDRs, nf.ServiceCIDRs = p.cfg.ClusterCIDRs, p.cfg.ServiceCIDRs
	node, ok := nodeview.Get(p.nodes, p.cfg.NodeName)
	if !ok {
		p.log.V(1).Info("own Node not found; no zone and no primary node IPs for NodePorts until it exists", "node", p.cfg.NodeName)
		return nf
	}
	nf.Zone = node.Labels[v1.LabelTopologyZone]
	nf.NodePortIPs = nodePortIPs(p.cfg.NodePortAddresses, node.PrimaryIPs(), localAddrs)
	nf.HealthCheckIPs = healthCheckIPs(p.cfg.NodePortAddresses, nf.NodePortIPs)
	return nf
}

// localAddrs are the addresses of the node's interfaces, which
// --nodeport-addresses CIDRs select from.
func localAddrs() []netip.Addr {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
