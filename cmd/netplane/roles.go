package main

import (
	"context"

	"github.com/netplane/netplane/controllers/endpointslice"
	"github.com/netplane/netplane/dns"
	"github.com/netplane/netplane/internal/role"
	"github.com/netplane/netplane/proxy"
)

func runController(ctx context.Context, d role.Deps) error { return endpointslice.Run(ctx, d) }

func runDNS(ctx context.Context, d role.Deps) error { return dns.Run(ctx, d) }

// runNode runs the service proxy; the pod networking half joins it here.
func runNode(ctx context.Context, d role.Deps) error { return proxy.Run(ctx, d) }
