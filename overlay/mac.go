package overlay

import (
	"crypto/sha256"
	"net"
	"net/netip"
)

// MAC is the tunnel device MAC of the node whose InternalIP is ip. Every
// node computes every other node's MAC from the Node object, so none is
// published anywhere.
//
// IPv4: 0e:6e followed by the four address bytes; injective, so two nodes
// never share a MAC. IPv6: the first six bytes of the SHA-256 of the
// address; 46 bits are left after the two fixed bits, so among 5,000 nodes
// a collision has odds of about 2 in 10 million, and the plan reports one
// instead of programming it. Both set the locally administered bit and
// clear the multicast bit, so no vendor MAC is ever taken.
func MAC(ip netip.Addr) net.HardwareAddr {
	ip = ip.Unmap()
	if ip.Is4() {
		b := ip.As4()
		return net.HardwareAddr{0x0e, 0x6e, b[0], b[1], b[2], b[3]}
	}
	b := ip.As16()
	sum := sha256.Sum256(b[:])
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// Gateway is the address routes through a tunnel device use as the
// gateway to the node whose InternalIP is ip; it is only the key of a
// permanent neighbour entry, never sent to. IPv4: the InternalIP itself.
// IPv6: the link-local address of the node's tunnel MAC (modified EUI-64),
// the address its tunnel device gets by default. IPv6 refuses an on-link
// gateway that another interface's route covers (`Nexthop has invalid
// gateway or device mismatch`), which a global address on the underlay's
// subnet is; a link-local gateway is taken on the device named.
func Gateway(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip
	}
	m := MAC(ip)
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: m[0] ^ 0x02, 9: m[1], 10: m[2], 11: 0xff, 12: 0xfe, 13: m[3], 14: m[4], 15: m[5]})
}
