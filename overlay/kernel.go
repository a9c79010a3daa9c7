package overlay

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nodeview"
)

// Kernel is what the overlay reads and writes of one network namespace:
// its links, addresses, routes, neighbour and FDB entries. A
// *netlink.Handle is one; FakeKernel is one in memory, for tests.
type Kernel interface {
	LinkByName(name string) (netlink.Link, error)
	LinkByIndex(index int) (netlink.Link, error)
	LinkAdd(l netlink.Link) error
	LinkDel(l netlink.Link) error
	LinkSetMTU(l netlink.Link, mtu int) error
	LinkSetHardwareAddr(l netlink.Link, mac net.HardwareAddr) error
	LinkSetUp(l netlink.Link) error
	AddrList(l netlink.Link, family int) ([]netlink.Addr, error)
	AddrAdd(l netlink.Link, a *netlink.Addr) error
	AddrDel(l netlink.Link, a *netlink.Addr) error
	RouteList(l netlink.Link, family int) ([]netlink.Route, error)
	RouteReplace(r *netlink.Route) error
	RouteDel(r *netlink.Route) error
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
	NeighSet(n *netlink.Neigh) error
	NeighDel(n *netlink.Neigh) error
}

var _ Kernel = (*netlink.Handle)(nil)

// linkMissing says whether err is the kernel's answer for a link that is
// not there: netlink's LinkNotFoundError, or ENODEV as it comes from the
// kernel (and from FakeKernel).
func linkMissing(err error) bool {
	var notFound netlink.LinkNotFoundError
	return errors.As(err, &notFound) || errors.Is(err, unix.ENODEV)
}

// families are the netlink families of the underlay families.
var families = map[nodeview.Family]int{nodeview.IPv4: netlink.FAMILY_V4, nodeview.IPv6: netlink.FAMILY_V6}

// mainRoutes dumps the main table of both families.
func mainRoutes(h Kernel) ([]netlink.Route, error) {
	var all []netlink.Route
	for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) { return h.RouteList(nil, families[f]) })
		if err != nil {
			return nil, fmt.Errorf("list %s routes: %w", f, err)
		}
		all = append(all, rs...)
	}
	return all, nil
}

// ConnectedPrefixes are the connected subnets among routes of the main
// table: a node whose InternalIP is in one is reached without a router, so
// a plain route via that address works. A connected subnet is a unicast
// route with an interface and without gateway or nexthop group: the prefix
// route the kernel adds for every address with a prefix length, an on-link
// prefix learned from router advertisements, or one an administrator added
// (`ip route add 10.1.0.0/16 dev eth0` for a segment shared by several
// subnets). Left out: default routes (a point-to-point default would make
// every node look adjacent), routes of this package (protocol 207), and
// routes through the tunnel devices (skip holds their indexes).
func ConnectedPrefixes(routes []netlink.Route, skip map[int]bool) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range routes {
		if r.Type != unix.RTN_UNICAST || r.Gw != nil || r.Via != nil || len(r.MultiPath) > 0 ||
			r.LinkIndex <= 0 || skip[r.LinkIndex] || r.Protocol == RouteProtocol {
			continue
		}
		p, ok := routeDst(r)
		if !ok || p.Bits() == 0 {
			continue
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// underlays finds, for each InternalIP of self, the interface that has it.
// An address on no interface gives no underlay: the plan then reports the
// nodes it would have tunnelled to.
func underlays(h Kernel, self nodeview.Node) ([]Underlay, error) {
	var out []Underlay
	for _, ip := range self.IPs {
		i, ok, err := link.InterfaceOf(h, ip)
		if err != nil {
			return nil, fmt.Errorf("underlay of InternalIP %s: %w", ip, err)
		}
		if ok {
			out = append(out, Underlay{Addr: ip, Index: i.Index, Name: i.Name, MTU: i.MTU})
		}
	}
	return out, nil
}

// tunnelIndexes are the indexes of the tunnel devices that exist.
func tunnelIndexes(h Kernel) (map[string]int, error) {
	out := map[string]int{}
	for _, name := range []string{DeviceV4, DeviceV6} {
		l, err := h.LinkByName(name)
		switch {
		case linkMissing(err):
		case err != nil:
			return nil, fmt.Errorf("look up %s: %w", name, err)
		default:
			out[name] = l.Attrs().Index
		}
	}
	return out, nil
}

// ensureDevice makes the tunnel device d exist, up, with its MAC, MTU and
// address. A device whose VNI, port, underlay or local address differs is
// recreated: the kernel cannot change those in place. It says whether the
// device was (re)created, which drops the routes through it.
func ensureDevice(h Kernel, d Device) (created bool, err error) {
	l, err := h.LinkByName(d.Name)
	if err != nil && !linkMissing(err) {
		return false, fmt.Errorf("look up %s: %w", d.Name, err)
	}
	if vx, ok := l.(*netlink.Vxlan); err != nil || !ok || !sameTunnel(vx, d) {
		if err == nil {
			if err := h.LinkDel(l); err != nil {
				return false, fmt.Errorf("delete %s to recreate it: %w", d.Name, err)
			}
		}
		if l, err = createDevice(h, d); err != nil {
			return false, err
		}
		created = true
	}
	a := l.Attrs()
	if a.MTU != d.MTU {
		if err := h.LinkSetMTU(l, d.MTU); err != nil {
			return created, fmt.Errorf("set MTU of %s to %d: %w", d.Name, d.MTU, err)
		}
	}
	if a.HardwareAddr.String() != d.MAC.String() {
		if err := h.LinkSetHardwareAddr(l, d.MAC); err != nil {
			return created, fmt.Errorf("set MAC of %s to %s: %w", d.Name, d.MAC, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return created, fmt.Errorf("set %s up: %w", d.Name, err)
		}
	}
	return created, ensureDeviceAddr(h, l, d)
}

func sameTunnel(vx *netlink.Vxlan, d Device) bool {
	return vx.VxlanId == d.VNI && vx.Port == d.Port && vx.VtepDevIndex == d.Underlay &&
		vx.SrcAddr.Equal(d.Local.AsSlice()) && !vx.Learning
}

func createDevice(h Kernel, d Device) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = d.Name
	attrs.MTU = d.MTU
	attrs.HardwareAddr = d.MAC
	vx := &netlink.Vxlan{LinkAttrs: attrs, VxlanId: d.VNI, Port: d.Port, VtepDevIndex: d.Underlay,
		SrcAddr: d.Local.AsSlice(), Learning: false}
	if err := h.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("create VXLAN device %s (VNI %d, port %d, local %s): %w", d.Name, d.VNI, d.Port, d.Local, err)
	}
	l, err := h.LinkByName(d.Name)
	if err != nil {
		return nil, fmt.Errorf("look up %s after creating it: %w", d.Name, err)
	}
	return l, nil
}

// ensureDeviceAddr leaves exactly d.Addr on the device, besides the IPv6
// link-local address the kernel gives every interface.
func ensureDeviceAddr(h Kernel, l netlink.Link, d Device) error {
	fam := families[nodeview.IPv4]
	if d.Addr.IsValid() {
		fam = families[nodeview.FamilyOf(d.Addr.Addr())]
	}
	have, err := link.Retry(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", d.Name, err)
	}
	found := false
	var errs []error
	for _, a := range have {
		p, ok := netipx.FromStdIPNet(a.IPNet)
		switch {
		case !ok || p.Addr().IsLinkLocalUnicast():
		case p == d.Addr:
			found = true
		default:
			if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				errs = append(errs, fmt.Errorf("remove address %s from %s: %w", p, d.Name, err))
			}
		}
	}
	if !found && d.Addr.IsValid() {
		a := &netlink.Addr{IPNet: netipx.PrefixIPNet(d.Addr)}
		if fam == netlink.FAMILY_V6 {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("add address %s to %s: %w", d.Addr, d.Name, err))
		}
	}
	return errors.Join(errs...)
}

// deleteDevice removes a tunnel device that the plan no longer has.
func deleteDevice(h Kernel, name string) error {
	l, err := h.LinkByName(name)
	if linkMissing(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
