package proxy

import (
	"net/netip"
	"slices"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/nodeview"
)

// This file resolves the node's facts the rules depend on (NodeFacts, which
// thisNode reads from the Nodes view), and where NodePorts and health-check
// node ports listen: pure functions of the flags, the Node's addresses and
// the interfaces' addresses, which localAddrs reads.

// NodeFacts are the facts about this node the rules depend on.
type NodeFacts struct {
	Name string
	Zone string // topology.kubernetes.io/zone of the Node
	// ClusterCIDRs are the cluster's pod CIDRs (nodeview.Settings): traffic
	// to a ClusterIP from outside all of them is masqueraded. Any number
	// per family.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs: new traffic to an address in them that is no ClusterIP
	// is dropped rather than routed off the node. At most one per family.
	ServiceCIDRs []netip.Prefix
	// NodePortIPs are the addresses NodePorts are served on.
	NodePortIPs []netip.Addr
	// HealthCheckIPs are the addresses the health-check node ports listen
	// on: NodePortIPs, or an unspecified address (0.0.0.0, ::) for every
	// address of its family when --nodeport-addresses matches them all.
	HealthCheckIPs []netip.Addr
	MasqueradeAll  bool
	// PodCIDRs are this node's: traffic masqueraded into a tunnel device
	// takes their address on it (nodeview.TunnelAddr) by SNAT.
	PodCIDRs []netip.Prefix
}

// thisNode reads this node's facts from the flags, the node's settings and
// the Nodes view.
type thisNode struct {
	log      logr.Logger
	cfg      v1alpha1.Node
	settings nodeview.Settings // the cluster's pod CIDRs
	nodes    cache.Store       // this node's Node, or every Node (views), slim
}

// facts are this node's facts as the Nodes view has them now.
func (n thisNode) facts() NodeFacts {
	nf := NodeFacts{Name: n.cfg.NodeName, MasqueradeAll: n.cfg.MasqueradeAll, ServiceCIDRs: n.cfg.ServiceCIDRs}
	var all []nodeview.Node
	if n.settings.ClusterCIDRsFromNodes() {
		for _, o := range n.nodes.List() {
			if r := nodeview.RecordOf(o); r != nil {
				all = append(all, *r)
			}
		}
	}
	nf.ClusterCIDRs = n.settings.ClusterCIDRs(all)
	node := n.self()
	if node == nil {
		n.log.V(1).Info("own Node not found; no zone and no primary node IPs for NodePorts until it exists", "node", n.cfg.NodeName)
		return nf
	}
	nf.Zone = node.Labels[v1.LabelTopologyZone]
	nf.PodCIDRs = node.PodCIDRs
	nf.NodePortIPs = nodePortIPs(n.cfg.NodePortAddresses, node.PrimaryIPs(), localAddrs)
	nf.HealthCheckIPs = healthCheckIPs(n.cfg.NodePortAddresses, nf.NodePortIPs)
	return nf
}

// self is this node's Node; nil until the view has it.
func (n thisNode) self() *nodeview.Node {
	if node, ok := nodeview.Get(n.nodes, n.cfg.NodeName); ok {
		return &node
	}
	return nil
}

// relevant reports whether a Node event from old to cur (either nil) is
// about what the proxy reads of the Nodes: this node's Node (addresses,
// zone, taint), or the cluster's pod CIDRs where the Nodes make them.
func (n thisNode) relevant(old, cur *nodeview.Node) bool {
	for _, r := range []*nodeview.Node{old, cur} {
		if r != nil && r.Name == n.cfg.NodeName {
			return true
		}
	}
	return n.settings.ClusterCIDRsChange(old, cur)
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
