// Package proxy is netplane's service proxy, a drop-in for kube-proxy's
// nftables mode: it programs Services and their EndpointSlices into one
// nftables table per family, named "netplane", on every node.
//
// The layers: records.go, service.go and topology.go reduce API objects to
// service ports and endpoints; build.go turns them into the desired tables (a pure
// function, golden-tested), and model.go keeps them up to date Service by
// Service; the nft package sends the kernel only the difference;
// proxier.go is the sync loop that ties them to the informer views
// (sync_informers.go) through their caches (caches.go), this node's facts
// (nodeaddrs.go) and the changes counted since the last sync (changes.go);
// this file, the node role's entry, starts it.
//
// Hook priorities are the contract with other software on the node, which
// must never edit our table but can order itself around it:
//
//	filter prerouting/output -110  loadBalancerSourceRanges (drop before DNAT)
//	nat    prerouting/output -100  Service DNAT (dstnat)
//	filter input/forward/output 0  reject (no endpoints, unknown ClusterIP port) or
//	                               drop (no local endpoint, unallocated ClusterIP)
//	nat    postrouting        100  masquerade (srcnat)
//
// The masquerade mark (0x4000) is internal and may change. SEMANTICS.md
// describes what happens to each kind of packet, what each flag changes, and
// where netplane differs from kube-proxy.
package proxy

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/memory"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
	"github.com/netplane/netplane/nodeview"
)

// gcPercent is the node role's GOGC unless $GOGC is set: at 10,000
// Services the peak resident memory of a full sync falls by about a
// quarter, for about a tenth more time (proxy/README.md).
const gcPercent = 50

// startupHeadroom lets the first sync of 1,000 Services run without a
// collection (memory.StartupHeadroom); at 10,000 the heap has it anyway.
const startupHeadroom = 16 << 20

// Feature is the Service proxy as a feature of the node role.
type Feature struct {
	d        role.Deps
	settings nodeview.Settings
	views    views
	metrics  *metrics
}

// New builds the proxy: it registers its metrics, and its views of
// Services, EndpointSlices and this node's Node (every Node while the
// cluster's pod CIDRs are theirs: no --cluster-cidr) on the process's
// informers.
func New(d role.Deps, s nodeview.Settings) (*Feature, error) {
	if d.MetricsHandler != nil {
		if err := d.MetricsHandler("/proxyMode", proxyModeHandler()); err != nil {
			return nil, err
		}
	}
	m := newMetrics()
	if err := d.Register(m.collectors()...); err != nil {
		return nil, err
	}
	v := registerViews(d.Factory, d.Config.Node.NodeName, s.ClusterCIDRsFromNodes())
	return &Feature{d: d, settings: s, views: v, metrics: m}, nil
}

// Run programs Services until ctx ends. A graceful stop leaves the rules in
// place, so Services keep working while the agent is restarted or upgraded.
func (f *Feature) Run(ctx context.Context) error {
	d := f.d
	if _, err := os.Stat("/proc/net/netfilter"); err != nil {
		d.Log.Info("no /proc/net/netfilter: is nf_tables available in this kernel?")
	}
	// The model is the role's big, long-lived state (proxy/README.md).
	memory.DefaultGCPercent(gcPercent)
	d.Factory.Start(ctx)
	p, err := newProxier(d, f.settings, f.views, f.metrics, programmers(nft.Dialer{}))
	if err != nil {
		return err
	}
	defer p.close()
	var synced []cache.DoneChecker
	for _, h := range []struct {
		view    *informer.Handle
		handler cache.ResourceEventHandler
	}{{f.views.services, p.eventHandler()}, {f.views.slices, p.eventHandler()}, {f.views.nodes, p.nodeHandler()}} {
		reg, err := h.view.AddEventHandler(h.handler)
		if err != nil {
			return err
		}
		// Waiting for the handlers too makes the first sync come after the
		// initial lists' events, not before a burst of them.
		synced = append(synced, h.view.Synced(), reg.HasSyncedChecker())
	}
	if addr := d.Config.Node.ProxyHealthzBindAddress; addr != "" {
		if err := p.nodeHealth().serve(ctx, addr); err != nil {
			return fmt.Errorf("node health server: %w", err)
		}
	}
	if !role.WaitForSync(ctx, d, "proxy", synced...) {
		return nil
	}
	// As the first sync, whose model and garbage set the peak memory,
	// starts, drop the executable's pages that only start-up read (beside
	// it: reading smaps takes about a millisecond).
	go memory.DropExecutablePages()
	memory.StartupHeadroom(startupHeadroom)
	p.run(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.health.Close(shutdown)
	d.Log.Info("stopped; rules left in place so Services keep working")
	return nil
}
