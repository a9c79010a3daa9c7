package proxy

import (
	"net/netip"
	"slices"
)

// This file resolves where NodePorts and health-check node ports listen:
// pure functions of the flags, the Node's addresses and the interfaces'
// addresses (read by the caller).

// nodePortIPs resolves --nodeport-addresses: empty or "primary" means the
// Node's primary IPs (first InternalIP, else ExternalIP, per family:
// nodeview.Node.PrimaryIPs); CIDRs select the node's own interface
// addresses (local).
func nodePortIPs(spec []string, primary []netip.Addr, local func() []netip.Addr) []netip.Addr {
	var out []netip.Addr
	var cidrs []netip.Prefix
	for _, s := range spec {
		if pr, err := netip.ParsePrefix(s); err == nil {
			cidrs = append(cidrs, pr.Masked())
		}
	}
	if len(spec) == 0 || slices.Contains(spec, "primary") {
		out = append(out, primary...)
	}
	if len(cidrs) > 0 {
		for _, a := range local() {
			if !a.IsLoopback() && slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(a) }) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// healthCheckIPs resolves where health-check node ports listen, as
// kube-proxy does: the node-port addresses, but every address of a family
// whose --nodeport-addresses include 0.0.0.0/0 or ::/0.
func healthCheckIPs(spec []string, nodePortIPs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, fam := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		all := slices.ContainsFunc(spec, func(s string) bool {
			p, err := netip.ParsePrefix(s)
			return err == nil && p.Bits() == 0 && p.Addr().Is4() == fam.Is4()
		})
		if all {
			out = append(out, fam)
			continue
		}
		for _, a := range nodePortIPs {
			if a.Is4() == fam.Is4() {
				out = append(out, a)
			}
		}
	}
	return out
}
