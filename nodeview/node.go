// Package nodeview holds what the node role's features share about Nodes
// and addresses, so that no feature imports another: the slim Node (the
// few facts a feature reads of a Node object), the views and sync loop
// over them, the address family, and the node's settings (settings.go)
// with the MTUs they decide (mtu.go). Features import it; it imports no
// feature.
package nodeview

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Node is what the node features read of a Node object: everything
// else, the kubelet's heartbeats above all, changes nothing they write.
type Node struct {
	Name        string
	IPs         []netip.Addr   // InternalIP, the first of each family
	ExternalIPs []netip.Addr   // ExternalIP, the first of each family
	PodCIDRs    []netip.Prefix // spec.podCIDRs, masked
	// Deleting is true once the Node has a deletion timestamp.
	Deleting bool
	// Labels, Annotations and Taints (by key, with their effect) hold
	// only the keys the view asked for (Keep); nil otherwise.
	Labels      map[string]string
	Annotations map[string]string
	Taints      []v1.Taint
}

// Keep names what a view keeps of a Node beyond its name, addresses, pod
// CIDRs and deletion.
type Keep struct {
	Labels, Annotations, Taints []string // keys
}

// Of reads the facts of n: its first InternalIP and ExternalIP of each
// family, its pod CIDRs (spec.podCIDR when spec.podCIDRs is empty), and
// what keep names. Unparsable values are dropped; a feature then says what
// the node lacks.
func Of(n *v1.Node, keep Keep) Node {
	out := Node{Name: n.Name, Deleting: n.DeletionTimestamp != nil}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	out.IPs = firstPerFamily(n.Status.Addresses, v1.NodeInternalIP)
	out.ExternalIPs = firstPerFamily(n.Status.Addresses, v1.NodeExternalIP)
	out.Labels = pick(n.Labels, keep.Labels)
	out.Annotations = pick(n.Annotations, keep.Annotations)
	for _, t := range n.Spec.Taints {
		if slices.Contains(keep.Taints, t.Key) {
			out.Taints = append(out.Taints, v1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	return out
}

// firstPerFamily are the first addresses of type typ of each family, in
// the order listed.
func firstPerFamily(addrs []v1.NodeAddress, typ v1.NodeAddressType) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a.Address)
		if a.Type != typ || err != nil {
			continue
		}
		ip = ip.Unmap()
		if !slices.ContainsFunc(out, func(h netip.Addr) bool { return h.Is4() == ip.Is4() }) {
			out = append(out, ip)
		}
	}
	return out
}

func pick(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// IP is n's InternalIP of family f, if any.
func (n Node) IP(f Family) (netip.Addr, bool) {
	for _, a := range n.IPs {
		if FamilyOf(a) == f {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// PrimaryIPs are n's primary addresses as kube-proxy takes them: per
// family, the InternalIP, else the ExternalIP.
func (n Node) PrimaryIPs() []netip.Addr {
	var out []netip.Addr
	for _, f := range Families {
		for _, ips := range [][]netip.Addr{n.IPs, n.ExternalIPs} {
			if i := slices.IndexFunc(ips, func(a netip.Addr) bool { return FamilyOf(a) == f }); i >= 0 {
				out = append(out, ips[i])
				break
			}
		}
	}
	return out
}

// WireGuardUnderlay is the address a node's WireGuard peers send to: its
// first InternalIP as listed. The tunnel's outer packets, and so the
// overhead pods' MTU leaves room for, are of its family.
func (n Node) WireGuardUnderlay() (netip.Addr, bool) {
	if len(n.IPs) == 0 {
		return netip.Addr{}, false
	}
	return n.IPs[0], true
}
