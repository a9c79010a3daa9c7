package nodeview

import (
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/link"
)

// VXLANOverhead is what VXLAN adds to a packet whose outer header is of
// family f: outer IP, UDP (8), VXLAN (8) and inner Ethernet (14) headers.
func VXLANOverhead(f Family) int {
	if f == IPv6 {
		return 40 + 8 + 8 + 14
	}
	return 20 + 8 + 8 + 14
}

// PodMTU is the MTU pods get. An explicit MTU wins. Otherwise, when pod
// traffic may be tunnelled (the overlay's mode is not never), the
// underlay's MTU less the largest VXLAN overhead of the underlay families
// in use (50 for IPv4, 70 for IPv6: one MTU serves both families of a
// dual-stack pod); the underlay's MTU when it never is.
func PodMTU(explicit int, tunnelled bool, underlayMTU int, families ...Family) int {
	if explicit > 0 {
		return explicit
	}
	if !tunnelled {
		return underlayMTU
	}
	worst := VXLANOverhead(IPv4)
	for _, f := range families {
		worst = max(worst, VXLANOverhead(f))
	}
	return underlayMTU - worst
}

// Underlay is what LocalPodMTU reads of the node's kernel: KernelUnderlay,
// or a feature's fake of it.
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

// LocalPodMTU is PodMTU on this node: the underlay is the interface that
// carries self's InternalIP (the smaller MTU where the two families'
// differ), or, when no local interface has one yet, the default route's
// interface.
func LocalPodMTU(u Underlay, explicit int, tunnelled bool, self Node) (int, error) {
	if explicit > 0 {
		return explicit, nil
	}
	mtu, fams := 0, []Family{}
	for _, ip := range self.IPs {
		i, ok, err := u.InterfaceOf(ip)
		if err != nil {
			return 0, err
		}
		if !ok {
			continue
		}
		if mtu == 0 || i.MTU < mtu {
			mtu = i.MTU
		}
		fams = append(fams, FamilyOf(ip))
	}
	if mtu == 0 {
		mtu = u.DefaultRouteMTU()
		for _, ip := range self.IPs {
			fams = append(fams, FamilyOf(ip))
		}
	}
	return PodMTU(0, tunnelled, mtu, fams...), nil
}
