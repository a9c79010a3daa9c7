package main

import (
	"context"
	"errors"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/cni/node"
	"github.com/netplane/netplane/controllers/endpointslice"
	"github.com/netplane/netplane/dns"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/proxy"
)

// roles maps each role to the parts the manager runs.
var roles = map[string]role.Role{
	v1alpha1.RoleController: endpointslice.Role,
	v1alpha1.RoleDNS:        role.Whole(v1alpha1.RoleDNS, dns.Run),
	v1alpha1.RoleNode:       role.Whole(v1alpha1.RoleNode, runNode),
}

// runNode runs the node agent's two halves side by side, the service proxy
// and pod networking; when one fails, the other is stopped too.
func runNode(ctx context.Context, d role.Deps) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	for _, half := range []role.Func{proxy.Run, node.Run} {
		go func() {
			err := half(ctx, d)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	return errors.Join(<-errs, <-errs)
}
