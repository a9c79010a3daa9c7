// Package node is the pod-networking half of the node role: it prepares the
// node for the netplane-cni plugin (bridge, CNI configuration, plugin binary,
// routes to other nodes' pod CIDRs, masquerade of pod egress).
package node

import (
	"context"

	"github.com/netplane/netplane/internal/role"
)

// Run is the pod-networking half of the node role.
func Run(ctx context.Context, d role.Deps) error {
	if !role.WaitForSync(ctx, d, "podnetwork", d.Informers.Core().V1().Nodes().Informer().HasSynced) {
		return nil
	}
	<-ctx.Done()
	return nil
}
