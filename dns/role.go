// Package dns is netplane's cluster DNS server: authoritative for the
// cluster domain, a caching forwarder for every other name.
package dns

import (
	"context"

	"github.com/netplane/netplane/internal/role"
)

// Run is the dns role.
func Run(ctx context.Context, d role.Deps) error {
	f := d.Informers
	if !role.WaitForSync(ctx, d, "dns",
		f.Core().V1().Services().Informer().HasSynced,
		f.Core().V1().Namespaces().Informer().HasSynced,
		f.Discovery().V1().EndpointSlices().Informer().HasSynced,
	) {
		return nil
	}
	<-ctx.Done()
	return nil
}
