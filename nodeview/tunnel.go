package nodeview

import "net/netip"

// The tunnel devices: the overlay's VXLAN device of each underlay family
// and WireGuard's. Each holds, as a host address, the network address of
// this node's pod CIDR of its family (TunnelAddr), so what the node sends
// into a tunnel leaves from that address whichever device carries it.
const (
	VXLANDeviceV4   = "netplane.vxlan"
	VXLANDeviceV6   = "netplane.vxlan6"
	WireGuardDevice = "netplane.wg"
)

// TunnelDevices are the tunnel devices that carry family f's pod traffic.
func TunnelDevices(f Family) []string {
	if f == IPv6 {
		return []string{VXLANDeviceV6, WireGuardDevice}
	}
	return []string{VXLANDeviceV4, WireGuardDevice}
}

// TunnelAddr is the address the tunnel devices hold for family f: the
// network address of the first of podCIDRs of that family.
func TunnelAddr(podCIDRs []netip.Prefix, f Family) (netip.Addr, bool) {
	for _, p := range podCIDRs {
		if FamilyOf(p.Addr()) == f {
			return p.Masked().Addr(), true
		}
	}
	return netip.Addr{}, false
}
