// Package endpointslice is netplane's EndpointSlice controller: it keeps the
// EndpointSlices of every Service with a selector true to its Pods.
package endpointslice

import (
	"context"

	"github.com/netplane/netplane/internal/role"
)

// Run is the controller role.
func Run(ctx context.Context, d role.Deps) error {
	f := d.Informers
	if !role.WaitForSync(ctx, d, "controller",
		f.Core().V1().Services().Informer().HasSynced,
		f.Core().V1().Pods().Informer().HasSynced,
		f.Core().V1().Nodes().Informer().HasSynced,
		f.Discovery().V1().EndpointSlices().Informer().HasSynced,
	) {
		return nil
	}
	<-ctx.Done()
	return nil
}
