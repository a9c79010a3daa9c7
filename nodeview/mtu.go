package nodeview

import (
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/link"
)

// The node has two MTUs: its underlay's (UnderlayMTU, read from the
// kernel) and its pods' (Settings.PodMTU, the underlay's less what the
// paths to other nodes add). The overlay sizes each VXLAN device by
// VXLANOverhead below its own underlay interface.

// VXLANOverhead is what VXLAN adds to a packet whose outer header is of
// family f: outer IP, UDP (8), VXLAN (8) and inner Ethernet (14) headers.
func VXLANOverhead(f Family) int {
	if f == IPv6 {
		return 40 + 8 + 8 + 14
	}
	return 20 + 8 + 8 + 14
}

// WireGuardOverhead is what WireGuard adds to a packet whose outer header
// is of family f: outer IP header, UDP (8), and WireGuard's data header
// and authentication tag (32).
func WireGuardOverhead(f Family) int {
	if f == IPv6 {
		return 40 + 8 + 32
	}
	return 20 + 8 + 32
}

// PodMTU is the MTU of the node self's pods, and of its WireGuard device,
// over an underlay of MTU underlay: --mtu when set; else the underlay's
// less the largest overhead of the paths pod traffic may take to another
// node: VXLAN's while the overlay may tunnel (50 bytes over IPv4, 70 over
// IPv6, the larger of self's InternalIP families: one MTU serves both
// families of a dual-stack pod), WireGuard's with encryption on (60 over
// IPv4, 80 over IPv6, by the family of the tunnel's outer packets, self's
// WireGuardUnderlay; IPv4's until self has one). Permissive encryption
// keeps the overlay, so the larger of the two counts.
func (s Settings) PodMTU(underlay int, self Node) int {
	if s.MTU > 0 {
		return s.MTU
	}
	overhead := 0
	if s.Tunnelled() {
		overhead = VXLANOverhead(IPv4)
		for _, ip := range self.IPs {
			overhead = max(overhead, VXLANOverhead(FamilyOf(ip)))
		}
	}
	if s.Encryption != NoEncryption {
		outer := IPv4
		if ip, ok := self.WireGuardUnderlay(); ok {
			outer = FamilyOf(ip)
		}
		overhead = max(overhead, WireGuardOverhead(outer))
	}
	return underlay - overhead
}

// Underlay is what UnderlayMTU reads of the node's kernel: KernelUnderlay,
// or a fake of it.
type Underlay interface {
	// InterfaceOf is the interface that holds ip; false when none does.
	InterfaceOf(ip netip.Addr) (link.Interface, bool, error)
	// DefaultRouteMTU is the MTU of the default route's interface; 1500
	// without one.
	DefaultRouteMTU() int
}

// KernelUnderlay is the Underlay of the kernel h talks to.
func KernelUnderlay(h *netlink.Handle) Underlay { return kernelUnderlay{h} }

type kernelUnderlay struct{ h *netlink.Handle }

func (k kernelUnderlay) InterfaceOf(ip netip.Addr) (link.Interface, bool, error) {
	return link.InterfaceOf(k.h, ip)
}

func (k kernelUnderlay) DefaultRouteMTU() int { return link.DefaultRouteMTU(k.h) }

// UnderlayMTU is the MTU of the node self's underlay: of the interface
// that carries its InternalIP (the smaller where the two families'
// differ), or, while no local interface holds one, the default route's.
func UnderlayMTU(u Underlay, self Node) (int, error) {
	mtu := 0
	for _, ip := range self.IPs {
		i, ok, err := u.InterfaceOf(ip)
		if err != nil {
			return 0, err
		}
		if ok && (mtu == 0 || i.MTU < mtu) {
			mtu = i.MTU
		}
	}
	if mtu == 0 {
		mtu = u.DefaultRouteMTU()
	}
	return mtu, nil
}
