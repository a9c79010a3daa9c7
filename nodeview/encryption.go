package nodeview

import "net/netip"

// WireGuardOverhead is what WireGuard adds to a packet whose outer header
// is of family f: outer IP header, UDP (8), and WireGuard's data header
// and authentication tag (32).
func WireGuardOverhead(f Family) int {
	if f == IPv6 {
		return 40 + 8 + 32
	}
	return 20 + 8 + 32
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

// LocalWireGuardMTU is the MTU of this node's WireGuard device and of its
// pods while encryption is on: the underlay's MTU (as LocalPodMTU reads
// it) less WireGuard's overhead in the family of the tunnel's outer
// packets (its WireGuardUnderlay; IPv4's until it has one).
func LocalWireGuardMTU(u Underlay, self Node) (int, error) {
	mtu, err := LocalPodMTU(u, 0, false, self)
	if err != nil {
		return 0, err
	}
	f := IPv4
	if ul, ok := self.WireGuardUnderlay(); ok {
		f = FamilyOf(ul)
	}
	return mtu - WireGuardOverhead(f), nil
}
