// Package proxy is netplane's service proxy, a drop-in for kube-proxy's
// nftables mode: it programs Services and their EndpointSlices into one
// nftables table per family, named "netplane", on every node.
//
// The layers: service.go and topology.go reduce API objects to service
// ports and endpoints; build.go turns them into the desired tables (a pure
// function, golden-tested), and model.go keeps them up to date Service by
// Service; the nft package sends the kernel only the difference;
// proxier.go is the sync loop that ties them to the informers, and this
// file starts it.
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
	"os"
	"time"

	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/nft"
)

// gcPercent is the node role's GOGC unless $GOGC is set: at 10,000
// Services the peak resident memory of a full sync falls by about a
// quarter, for about a tenth more time (proxy/README.md).
const gcPercent = 50

// startupHeadroom lets the first sync of 1,000 Services run without a
// collection (role.StartupHeadroom); at 10,000 the heap has it anyway.
const startupHeadroom = 16 << 20

// Run is the proxy half of the node role. A graceful stop leaves the rules in
// place, so Services keep working while the agent is restarted or upgraded.
func Run(ctx context.Context, d role.Deps) error {
	if _, err := os.Stat("/proc/net/netfilter"); err != nil {
		d.Log.Info("no /proc/net/netfilter: is nf_tables available in this kernel?")
	}
	// The model is the role's big, long-lived state (proxy/README.md).
	role.DefaultGCPercent(gcPercent)
	// Services and EndpointSlices come from a factory of the proxy's own,
	// whose objects are slimmed (sync_informers.go): in a process with the
	// controller role too, the shared factory must keep them whole.
	own := proxyInformers(d.ProtobufClient())
	defer own.Shutdown()
	p := newProxier(d, own, programmers(nft.Dialer{}))
	defer p.close()
	handler := p.eventHandler()
	if _, err := own.Core().V1().Services().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := own.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := d.Informers.Core().V1().Nodes().Informer().AddEventHandler(p.nodeHandler()); err != nil {
		return err
	}
	d.Checks.AddHealth("proxy", p.healthz)
	own.Start(ctx.Done())
	if !role.WaitForSync(ctx, d, "proxy",
		own.Core().V1().Services().Informer().HasSyncedChecker(),
		d.Informers.Core().V1().Nodes().Informer().HasSyncedChecker(),
		own.Discovery().V1().EndpointSlices().Informer().HasSyncedChecker(),
	) {
		return nil
	}
	// As the first sync, whose model and garbage set the peak memory,
	// starts, drop the executable's pages that only start-up read (beside
	// it: reading smaps takes about a millisecond).
	go role.DropExecutablePages()
	role.StartupHeadroom(startupHeadroom)
	p.run(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.health.Close(shutdown)
	d.Log.Info("stopped; rules left in place so Services keep working")
	return nil
}
