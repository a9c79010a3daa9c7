// Package proxy is netplane's service proxy: it programs Services and their
// EndpointSlices into nftables on every node.
package proxy

import (
	"context"

	"github.com/netplane/netplane/internal/role"
)

// Run is the proxy half of the node role.
func Run(ctx context.Context, d role.Deps) error {
	f := d.Informers
	if !role.WaitForSync(ctx, d, "proxy",
		f.Core().V1().Services().Informer().HasSynced,
		f.Core().V1().Nodes().Informer().HasSynced,
		f.Discovery().V1().EndpointSlices().Informer().HasSynced,
	) {
		return nil
	}
	<-ctx.Done()
	return nil
}
