package proxy

import (
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/nodeview"
)

// This file resolves the node's facts the rules depend on, and where
// NodePorts and health-check node ports listen: pure functions of the
// flags, the Node's addresses and the interfaces' addresses, which
// localAddrs reads.

// nodeFacts are this node's facts from the flags, the node's settings and
// the Nodes.
func (p *proxier) nodeFacts() NodeFacts {
	nf := NodeFacts{Name: p.cfg.NodeName, MasqueradeAll: p.cfg.MasqueradeAll, ServiceCIDRs: p.cfg.ServiceCIDRs}
	var all []nodeview.Node
	if p.settings.ClusterCIDRsFromNodes() {
		for _, o := range p.nodes.List() {
			if n := nodeview.RecordOf(o); n != nil {
				all = append(all, *n)
			}
		}
	}
	nf.ClusterCIDRs = p.settings.ClusterCIDRs(all)
	node, ok := nodeview.Get(p.nodes, p.cfg.NodeName)
	if !ok {
		p.log.V(1).Info("own Node not found; no zone and no primary node IPs for NodePorts until it exists", "node", p.cfg.NodeName)
		return nf
	}
	nf.Zone = node.Labels[v1.LabelTopologyZone]
	nf.NodePortIPs = nodePortIPs(p.cfg.NodePortAddresses, node.PrimaryIPs(), localAddrs)
	nf.HealthCheckIPs = healthCheckIPs(p.cfg.NodePortAddresses, nf.NodePortIPs)
	return nf
}

// localAddrs are the addresses of the node's interfaces, which
// --nodeport-addresses CIDRs select from.
func localAddrs() []netip.Addr {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

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
