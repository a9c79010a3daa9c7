package overlay

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nodeview"
)

// FakeKernel is a network namespace in memory behind Kernel, so that the
// Syncer's reading, diffing and writing are tested without root: links,
// addresses, the main table's routes, neighbour and FDB entries. It
// refuses what the kernel refuses, with the kernel's errors:
//
//   - a link added under a name taken (EEXIST), a VXLAN device on an
//     underlay that is not there, anything on a link that is not there
//     (ENODEV);
//   - a VXLAN device's MTU above its underlay's less the encapsulation
//     (EINVAL);
//   - an address added twice (EEXIST) or deleted while absent
//     (EADDRNOTAVAIL);
//   - a route through a link that is down (ENETDOWN), or via a gateway
//     that no connected subnet holds and not onlink (ENETUNREACH); a
//     route deleted while absent (ESRCH);
//   - an FDB entry on a device that is not VXLAN (EOPNOTSUPP); an entry
//     deleted while absent (ENOENT).
//
// Deleting a link takes its addresses, routes and entries with it, as the
// kernel does. Dump lists the state in the words of `ip` and `bridge`. Not
// safe for concurrent use.
type FakeKernel struct {
	links  []*fakeLink // in the order made; the index is the position + 1
	routes []netlink.Route
	writes int
	refuse map[netip.Prefix]error // routes refused whatever they are (RefuseRoute)
}

type fakeLink struct {
	l     netlink.Link // nil: deleted
	addrs []netip.Prefix
	neigh map[netip.Addr]netlink.Neigh
	fdb   map[string]netlink.Neigh // by MAC and destination
}

var _ Kernel = (*FakeKernel)(nil)

// NewFakeKernel is a namespace without links.
func NewFakeKernel() *FakeKernel { return &FakeKernel{} }

// AddUnderlay adds an interface that is up, as the machine's own, with
// its addresses; it returns its index.
func (k *FakeKernel) AddUnderlay(name string, mtu int, addrs ...netip.Prefix) int {
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.Flags = name, mtu, net.FlagUp
	attrs.Index = len(k.links) + 1
	k.links = append(k.links, &fakeLink{l: &netlink.Dummy{LinkAttrs: attrs}, addrs: addrs,
		neigh: map[netip.Addr]netlink.Neigh{}, fdb: map[string]netlink.Neigh{}})
	return attrs.Index
}

// RefuseRoute makes every write of a route to dst fail with err, as a
// kernel that refuses it for reasons of its own (a policy, a full table).
func (k *FakeKernel) RefuseRoute(dst netip.Prefix, err error) {
	if k.refuse == nil {
		k.refuse = map[netip.Prefix]error{}
	}
	k.refuse[dst] = err
}

// Writes is how many writes the kernel took since the last call.
func (k *FakeKernel) Writes() int {
	n := k.writes
	k.writes = 0
	return n
}

func (k *FakeKernel) byIndex(idx int) (*fakeLink, error) {
	if idx < 1 || idx > len(k.links) || k.links[idx-1].l == nil {
		return nil, fmt.Errorf("link index %d: %w", idx, unix.ENODEV)
	}
	return k.links[idx-1], nil
}

func (k *FakeKernel) of(l netlink.Link) (*fakeLink, error) {
	if l.Attrs().Index == 0 {
		if _, err := k.LinkByName(l.Attrs().Name); err != nil {
			return nil, err
		}
		for _, fl := range k.links {
			if fl.l != nil && fl.l.Attrs().Name == l.Attrs().Name {
				return fl, nil
			}
		}
	}
	return k.byIndex(l.Attrs().Index)
}

// clone is a copy of l for a caller, which may change it.
func clone(l netlink.Link) netlink.Link {
	switch v := l.(type) {
	case *netlink.Vxlan:
		c := *v
		return &c
	case *netlink.Dummy:
		c := *v
		return &c
	}
	return l
}

func (k *FakeKernel) LinkByName(name string) (netlink.Link, error) {
	for _, fl := range k.links {
		if fl.l != nil && fl.l.Attrs().Name == name {
			return clone(fl.l), nil
		}
	}
	return nil, fmt.Errorf("link %s: %w", name, unix.ENODEV)
}

func (k *FakeKernel) LinkByIndex(idx int) (netlink.Link, error) {
	fl, err := k.byIndex(idx)
	if err != nil {
		return nil, err
	}
	return clone(fl.l), nil
}

// mtuFits says whether a VXLAN device may have mtu over its underlay.
func (k *FakeKernel) mtuFits(vx *netlink.Vxlan, mtu int) error {
	under, err := k.byIndex(vx.VtepDevIndex)
	if err != nil {
		return err
	}
	f := nodeview.IPv4
	if vx.SrcAddr.To4() == nil {
		f = nodeview.IPv6
	}
	if mtu > under.l.Attrs().MTU-nodeview.VXLANOverhead(f) {
		return fmt.Errorf("MTU %d of %s above its underlay's %d less the encapsulation: %w", mtu, vx.Name, under.l.Attrs().MTU, unix.EINVAL)
	}
	return nil
}

func (k *FakeKernel) LinkAdd(l netlink.Link) error {
	if _, err := k.LinkByName(l.Attrs().Name); err == nil {
		return fmt.Errorf("link %s: %w", l.Attrs().Name, unix.EEXIST)
	}
	l = clone(l)
	if vx, ok := l.(*netlink.Vxlan); ok {
		if err := k.mtuFits(vx, vx.MTU); err != nil {
			return err
		}
	}
	a := l.Attrs()
	a.Index, a.Flags = len(k.links)+1, 0
	k.links = append(k.links, &fakeLink{l: l, neigh: map[netip.Addr]netlink.Neigh{}, fdb: map[string]netlink.Neigh{}})
	k.writes++
	return nil
}

func (k *FakeKernel) LinkDel(l netlink.Link) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	idx := fl.l.Attrs().Index
	k.routes = slices.DeleteFunc(k.routes, func(r netlink.Route) bool { return r.LinkIndex == idx })
	*fl = fakeLink{}
	k.writes++
	return nil
}

func (k *FakeKernel) LinkSetMTU(l netlink.Link, mtu int) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	if vx, ok := fl.l.(*netlink.Vxlan); ok {
		if err := k.mtuFits(vx, mtu); err != nil {
			return err
		}
	}
	fl.l.Attrs().MTU = mtu
	k.writes++
	return nil
}

func (k *FakeKernel) LinkSetHardwareAddr(l netlink.Link, mac net.HardwareAddr) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	fl.l.Attrs().HardwareAddr = slices.Clone(mac)
	k.writes++
	return nil
}

func (k *FakeKernel) LinkSetUp(l netlink.Link) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	fl.l.Attrs().Flags |= net.FlagUp
	k.writes++
	return nil
}

// familyMatches says whether an address of the fake is of a netlink
// family (FAMILY_ALL: any).
func familyMatches(a netip.Addr, family int) bool {
	switch family {
	case netlink.FAMILY_V4:
		return a.Is4()
	case netlink.FAMILY_V6:
		return a.Is6()
	}
	return true
}

func (k *FakeKernel) AddrList(l netlink.Link, family int) ([]netlink.Addr, error) {
	var out []netlink.Addr
	for _, fl := range k.links {
		if fl.l == nil || l != nil && fl.l.Attrs().Name != l.Attrs().Name {
			continue
		}
		for _, p := range fl.addrs {
			if familyMatches(p.Addr(), family) {
				out = append(out, netlink.Addr{IPNet: netipx.PrefixIPNet(p), LinkIndex: fl.l.Attrs().Index})
			}
		}
	}
	return out, nil
}

func (k *FakeKernel) AddrAdd(l netlink.Link, a *netlink.Addr) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	p, _ := netipx.FromStdIPNet(a.IPNet)
	if slices.Contains(fl.addrs, p) {
		return fmt.Errorf("address %s: %w", p, unix.EEXIST)
	}
	fl.addrs = append(fl.addrs, p)
	k.writes++
	return nil
}

func (k *FakeKernel) AddrDel(l netlink.Link, a *netlink.Addr) error {
	fl, err := k.of(l)
	if err != nil {
		return err
	}
	p, _ := netipx.FromStdIPNet(a.IPNet)
	i := slices.Index(fl.addrs, p)
	if i < 0 {
		return fmt.Errorf("address %s: %w", p, unix.EADDRNOTAVAIL)
	}
	fl.addrs = slices.Delete(fl.addrs, i, i+1)
	k.writes++
	return nil
}

// connected are the prefix routes the kernel keeps for the addresses of
// the links that are up.
func (k *FakeKernel) connected() []netlink.Route {
	var out []netlink.Route
	for _, fl := range k.links {
		if fl.l == nil || fl.l.Attrs().Flags&net.FlagUp == 0 {
			continue
		}
		for _, p := range fl.addrs {
			if p.Bits() < p.Addr().BitLen() {
				out = append(out, netlink.Route{Dst: netipx.PrefixIPNet(p.Masked()), LinkIndex: fl.l.Attrs().Index,
					Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_KERNEL, Table: unix.RT_TABLE_MAIN, Scope: netlink.SCOPE_LINK})
			}
		}
	}
	return out
}

func routeFamily(r netlink.Route) netip.Addr {
	if r.Dst != nil {
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		return a.Unmap()
	}
	a, _ := netip.AddrFromSlice(r.Gw)
	return a.Unmap()
}

func (k *FakeKernel) RouteList(l netlink.Link, family int) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, r := range append(k.connected(), k.routes...) {
		if familyMatches(routeFamily(r), family) && (l == nil || r.LinkIndex == l.Attrs().Index) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (k *FakeKernel) RouteReplace(r *netlink.Route) error {
	if p, ok := netipx.FromStdIPNet(r.Dst); ok && k.refuse[p] != nil {
		return k.refuse[p]
	}
	w := *r
	if w.Table == 0 {
		w.Table = unix.RT_TABLE_MAIN
	}
	if w.Type == 0 {
		w.Type = unix.RTN_UNICAST
	}
	if w.LinkIndex != 0 {
		fl, err := k.byIndex(w.LinkIndex)
		if err != nil {
			return err
		}
		if fl.l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("route %s dev %s: %w", w.Dst, fl.l.Attrs().Name, unix.ENETDOWN)
		}
	}
	if gw, ok := netip.AddrFromSlice(w.Gw); ok && w.Flags&int(netlink.FLAG_ONLINK) == 0 {
		i := slices.IndexFunc(k.connected(), func(c netlink.Route) bool {
			p, _ := netipx.FromStdIPNet(c.Dst)
			return p.Contains(gw.Unmap()) && (w.LinkIndex == 0 || w.LinkIndex == c.LinkIndex)
		})
		if i < 0 {
			return fmt.Errorf("route %s via %s: %w", w.Dst, gw, unix.ENETUNREACH)
		}
		w.LinkIndex = k.connected()[i].LinkIndex
	}
	k.routes = slices.DeleteFunc(k.routes, func(o netlink.Route) bool { return o.Table == w.Table && o.Dst.String() == w.Dst.String() })
	k.routes = append(k.routes, w)
	k.writes++
	return nil
}

func (k *FakeKernel) RouteDel(r *netlink.Route) error {
	i := slices.IndexFunc(k.routes, func(o netlink.Route) bool {
		return o.Dst.String() == r.Dst.String() && (r.Gw == nil || r.Gw.Equal(o.Gw)) &&
			(r.LinkIndex == 0 || r.LinkIndex == o.LinkIndex) && (r.Protocol == 0 || r.Protocol == o.Protocol)
	})
	if i < 0 {
		return fmt.Errorf("route %s via %s: %w", r.Dst, r.Gw, unix.ESRCH)
	}
	k.routes = slices.Delete(k.routes, i, i+1)
	k.writes++
	return nil
}

func fdbKey(n netlink.Neigh) string { return n.HardwareAddr.String() + " " + n.IP.String() }

func (k *FakeKernel) NeighList(idx, family int) ([]netlink.Neigh, error) {
	fl, err := k.byIndex(idx)
	if err != nil {
		return nil, err
	}
	var out []netlink.Neigh
	if family == unix.AF_BRIDGE {
		for _, n := range fl.fdb {
			out = append(out, n)
		}
		return out, nil
	}
	for a, n := range fl.neigh {
		if familyMatches(a, family) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (k *FakeKernel) NeighSet(n *netlink.Neigh) error {
	fl, err := k.byIndex(n.LinkIndex)
	if err != nil {
		return err
	}
	if n.Family == unix.AF_BRIDGE {
		if _, ok := fl.l.(*netlink.Vxlan); !ok {
			return fmt.Errorf("fdb on %s: %w", fl.l.Attrs().Name, unix.EOPNOTSUPP)
		}
		fl.fdb[fdbKey(*n)] = *n
	} else {
		a, _ := netip.AddrFromSlice(n.IP)
		fl.neigh[a.Unmap()] = *n
	}
	k.writes++
	return nil
}

func (k *FakeKernel) NeighDel(n *netlink.Neigh) error {
	fl, err := k.byIndex(n.LinkIndex)
	if err != nil {
		return err
	}
	a, _ := netip.AddrFromSlice(n.IP)
	switch _, fdb := fl.fdb[fdbKey(*n)]; {
	case n.Family == unix.AF_BRIDGE && fdb:
		delete(fl.fdb, fdbKey(*n))
	case n.Family != unix.AF_BRIDGE && fl.neigh[a.Unmap()].IP != nil:
		delete(fl.neigh, a.Unmap())
	default:
		return fmt.Errorf("neighbour %s: %w", n.IP, unix.ENOENT)
	}
	k.writes++
	return nil
}

// Dump is the namespace's links, the routes besides the kernel's own
// prefix routes, and the entries, one a line, sorted within each kind.
func (k *FakeKernel) Dump() string {
	var links, routes, entries []string
	name := func(idx int) string {
		if fl, err := k.byIndex(idx); err == nil {
			return fl.l.Attrs().Name
		}
		return fmt.Sprintf("#%d", idx)
	}
	for _, fl := range k.links {
		if fl.l == nil {
			continue
		}
		a := fl.l.Attrs()
		s := "link " + a.Name
		if vx, ok := fl.l.(*netlink.Vxlan); ok {
			s += fmt.Sprintf(" vxlan id %d dstport %d dev %s local %s address %s", vx.VxlanId, vx.Port, name(vx.VtepDevIndex), vx.SrcAddr, a.HardwareAddr)
		}
		if a.Flags&net.FlagUp != 0 {
			s += " up"
		}
		s += fmt.Sprintf(" mtu %d", a.MTU)
		for _, p := range fl.addrs {
			s += " addr " + p.String()
		}
		links = append(links, s)
		for _, n := range fl.neigh {
			entries = append(entries, fmt.Sprintf("neigh %s lladdr %s dev %s", n.IP, n.HardwareAddr, a.Name))
		}
		for _, n := range fl.fdb {
			entries = append(entries, fmt.Sprintf("fdb %s dst %s dev %s", n.HardwareAddr, n.IP, a.Name))
		}
	}
	for _, r := range k.routes {
		s := "route default"
		if r.Dst != nil {
			s = "route " + r.Dst.String()
		}
		if r.Gw != nil {
			s += " via " + r.Gw.String()
		}
		s += " dev " + name(r.LinkIndex)
		if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
			s += " onlink"
		}
		routes = append(routes, s+fmt.Sprintf(" proto %d", r.Protocol))
	}
	slices.Sort(routes)
	slices.Sort(entries)
	return strings.Join(slices.Concat(links, routes, entries), "\n") + "\n"
}
