package main

import (
	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/controllers"
	"github.com/netplane/netplane/dns"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/node"
	"github.com/netplane/netplane/relay"
)

// roles maps each role to the parts the manager runs.
var roles = map[string]role.Role{
	v1alpha1.RoleController: controllers.Role,
	v1alpha1.RoleDNS:        dns.Role,
	v1alpha1.RoleNode:       node.Role,
	v1alpha1.RoleRelay:      relay.Role,
}
