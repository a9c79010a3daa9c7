package node

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/cni/conflist"
)

// ConflistName sorts first in the CNI configuration directory, so runtimes
// that use the lexicographically first file pick netplane.
const ConflistName = "00-netplane.conflist"

// nodeInfo is what pod networking needs of a Node.
type nodeInfo struct {
	Name     string
	PodCIDRs []netip.Prefix
	IPs      []netip.Addr // at most one per family: InternalIP, else ExternalIP
}

func infoOf(n *v1.Node) nodeInfo {
	ni := nodeInfo{Name: n.Name}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			ni.PodCIDRs = append(ni.PodCIDRs, p.Masked())
		}
	}
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if a.Type != typ || err != nil || slices.ContainsFunc(ni.IPs, func(h netip.Addr) bool { return h.Is4() == ip.Is4() }) {
				continue
			}
			ni.IPs = append(ni.IPs, ip.Unmap())
		}
	}
	return ni
}

// route sends a pod CIDR of another node to that node's address.
type route struct {
	Dst  netip.Prefix
	Via  netip.Addr
	Node string
}

// desiredRoutes is a route per pod CIDR of every other node, via that
// node's address of the same family. Nodes without such an address get none.
func desiredRoutes(self string, nodes []nodeInfo) []route {
	var out []route
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		for _, p := range n.PodCIDRs {
			for _, ip := range n.IPs {
				if ip.Is4() == p.Addr().Is4() {
					out = append(out, route{Dst: p, Via: ip, Node: n.Name})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b route) int { return strings.Compare(a.Dst.String(), b.Dst.String()) })
	return out
}

// masqPlan says which pod traffic leaving the node keeps its source: pods
// of this node (sources) reaching the cluster's pod network (exempt) are
// not masqueraded. The exempt list is --cluster-cidr, or, when unset, every
// node's pod CIDRs.
type masqPlan struct {
	Sources []netip.Prefix
	Exempt  []netip.Prefix
}

func planMasquerade(self nodeInfo, clusterCIDRs []netip.Prefix, nodes []nodeInfo) masqPlan {
	p := masqPlan{Sources: self.PodCIDRs, Exempt: clusterCIDRs}
	if len(clusterCIDRs) == 0 {
		for _, n := range nodes {
			p.Exempt = append(p.Exempt, n.PodCIDRs...)
		}
	}
	slices.SortFunc(p.Exempt, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	p.Exempt = slices.Compact(p.Exempt)
	return p
}

// conflistOpts is what the conflist says.
type conflistOpts struct {
	PodCIDRs []netip.Prefix
	Bridge   string
	MTU      int
	StateDir string
}

// renderConflist is the conflist for this node. It names 1.0.0 for old
// runtimes and lists 1.1.0 so that newer ones send STATUS and GC.
func renderConflist(o conflistOpts) []byte {
	cidrs := make([]string, 0, len(o.PodCIDRs))
	for _, p := range o.PodCIDRs {
		cidrs = append(cidrs, p.String())
	}
	l := conflist.List{
		CNIVersion:  "1.0.0",
		CNIVersions: []string{"1.0.0", "1.1.0"},
		Name:        "netplane",
		Plugins: []conflist.Plugin{{
			Type:         conflist.Type,
			Bridge:       o.Bridge,
			MTU:          o.MTU,
			PodCIDRs:     cidrs,
			StateDir:     o.StateDir,
			Capabilities: map[string]bool{"portMappings": true},
		}},
	}
	b, _ := json.MarshalIndent(l, "", "  ")
	return append(b, '\n')
}
