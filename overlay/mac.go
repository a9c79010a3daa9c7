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
