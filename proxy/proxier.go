package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// proxier is the level-triggered sync loop: any event marks the state dirty
// (changes.go), and a sync recomputes the desired tables from the views'
// caches (caches.go) and this node's facts (nodeaddrs.go).
type proxier struct {
	log     logr.Logger
	cfg     v1alpha1.Node
	caches  caches
	node    thisNode
	syncers map[nodeview.Family]nft.Syncer // the tables, by family
	model   *Model
	health  *healthServers
	metrics *metrics
	// loop decides when sync runs (kube-proxy's --min-sync-period and
	// --sync-period), and owns its checks, log of failures and metrics.
	loop    *nodeview.Loop
	changes changes
	udp     udpCleaner
	startup startup
}

// newProxier reads Services, EndpointSlices and Nodes from the proxy's
// views and programs its tables through syncers.
func newProxier(d role.Deps, s nodeview.Settings, v views, m *metrics, syncers map[nodeview.Family]nft.Syncer) (*proxier, error) {
	p := &proxier{
		log:     d.Log,
		cfg:     d.Config.Node,
		caches:  caches{services: v.services.Indexer(), slices: v.slices.Indexer()},
		node:    thisNode{log: d.Log, cfg: d.Config.Node, settings: s, nodes: v.nodes.Indexer()},
		syncers: syncers,
		model:   NewModel(),
		metrics: m,
		changes: changes{gauge: m.pendingChanges, started: time.Now()},
		udp:     udpCleaner{clean: cleanConntrack},
		startup: startup{log: d.Log, cfg: d.Config.Node},
	}
	var err error
	if p.loop, err = nodeview.NewLoop(d, "proxy", p.runSync); err != nil {
		return nil, err
	}
	p.changes.request = p.loop.Request
	p.health = newHealthServers(d.Log, func() bool { return p.healthz() == nil })
	return p, nil
}

// eventHandler takes the Services' and EndpointSlices' events.
func (p *proxier) eventHandler() cache.ResourceEventHandler { return p.changes.eventHandler() }

// nodeHandler takes the Nodes' events.
func (p *proxier) nodeHandler() cache.ResourceEventHandler {
	return p.changes.nodeHandler(p.node.relevant)
}

// nodeHealth is the node health server of this proxier.
func (p *proxier) nodeHealth() nodeHealthServer {
	healthy := func() bool { return p.healthz() == nil }
	return nodeHealthServer{log: p.log, node: p.node.self, healthy: healthy, lastSynced: p.loop.LastSuccess}
}

// healthz fails, as kube-proxy's does, when a change has waited for
// programming longer than twice the sync period.
func (p *proxier) healthz() error { return p.loop.Healthy() }

func (p *proxier) close() {
	for _, s := range p.syncers {
		s.Close()
	}
}

// run syncs until ctx ends, as the loop decides.
func (p *proxier) run(ctx context.Context) { p.loop.Run(ctx) }

// runSync is one sync as the loop runs it.
func (p *proxier) runSync(_ context.Context, full bool) error {
	err := p.sync(full)
	p.startup.syncEnded()
	return err
}

// sync programs the current state. Changes arriving meanwhile stay pending.
func (p *proxier) sync(full bool) error {
	start := time.Now()
	triggers, dirty := p.changes.take()

	// A partial sync reads only the Services changed since the last one,
	// unless the node's facts changed or a Node event came (they change
	// every Service's rules).
	var d *Desired
	node := p.node.facts()
	if !full && dirty != nil && p.model.Built(node) {
		if changes, err := p.caches.delta(dirty); err == nil {
			d = p.model.Apply(changes)
		} else {
			p.log.Error(err, "reading the changed Services; reading all of them instead")
		}
	}
	if d == nil {
		in, err := p.caches.input(node)
		if err != nil {
			p.changes.readAll()
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
		p.changes.failed(triggers)
		return err
	}
	p.afterSync(d, full, start, built, triggers)
	return nil
}

// afterSync does what follows a sync that worked: the log line and
// metrics, the health check servers, the stale UDP conntrack entries and,
// after the first, the startup's one-time work.
func (p *proxier) afterSync(d *Desired, full bool, start, built time.Time, triggers []time.Time) {
	kind := "partial"
	if full {
		kind = "full"
	}
	now := time.Now()
	// Logged before the conntrack clean-up: its time is when the kernel had
	// every rule (the proxy benchmark reads it).
	p.log.V(2).Info("synced", "type", kind, "took", now.Sub(start), "building", built.Sub(start), "programming", now.Sub(built))
	p.metrics.observeProgramming(now, triggers)
	p.metrics.observeNoLocal(d.NoLocalInternal, d.NoLocalExternal)
	p.health.Sync(d.Health)
	n, err := p.udp.synced(d.UDP)
	if err != nil {
		p.log.Error(err, "deleting stale UDP conntrack entries")
	}
	p.metrics.conntrackDeletions.Add(float64(n))
	p.startup.synced()
}
