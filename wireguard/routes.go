package wireguard

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
)

// RouteProtocol marks the routes this package owns (rtnetlink protocol
// number): the overlay owns 207, so a switch between the two replaces the
// other's routes instead of meeting them.
const RouteProtocol = 208

// Route sends a prefix into the device; Src, when valid, is the source
// the node's own packets to it leave from.
type Route struct {
	Dst netip.Prefix
	Src netip.Addr
}

// Routes are the routes into the device: every peer's allowed IPs, the
// plan's Drop list (no peer allows them: WireGuard drops what reaches
// it), and the cluster's pod CIDRs, which catch the pod addresses of no
// known node the same way. Each takes as source the address of its family
// among own (this node's addresses on the device, from its pod CIDRs), so
// that what the node sends into the tunnel comes from an address its
// peers allow. Sorted, without repeats.
func Routes(plan Plan, cluster []netip.Prefix, own []netip.Addr) []Route {
	var dsts []netip.Prefix
	for _, p := range plan.Peers {
		dsts = append(dsts, p.AllowedIPs...)
	}
	dsts = append(dsts, plan.Drop...)
	dsts = append(dsts, cluster...)
	for i := range dsts {
		dsts[i] = dsts[i].Masked()
	}
	slices.SortFunc(dsts, comparePrefix)
	dsts = slices.Compact(dsts)
	out := make([]Route, 0, len(dsts))
	for _, d := range dsts {
		r := Route{Dst: d}
		for _, a := range own {
			if a.Is4() == d.Addr().Is4() {
				r.Src = a
				break
			}
		}
		out = append(out, r)
	}
	return out
}

// DeviceAddrs are this node's addresses on the device: the network
// address of each of its pod CIDRs, as the overlay's tunnel devices hold
// it. The bridge holds the first address; a host address may be on two
// interfaces, but one of its own keeps the device independent of the pod
// network's order of start.
func DeviceAddrs(podCIDRs []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range podCIDRs {
		if !slices.ContainsFunc(out, func(a netip.Addr) bool { return a.Is4() == p.Addr().Is4() }) {
			out = append(out, p.Masked().Addr())
		}
	}
	return out
}

// syncLink puts exactly addrs (as host addresses) on the device's link and
// makes the routes of this package exactly want, through it. A route that
// differs is replaced in place, so a prefix never goes without a route.
func syncLink(h *netlink.Handle, l netlink.Link, addrs []netip.Addr, want []Route) error {
	if err := syncAddrs(h, l, addrs); err != nil {
		return err
	}
	have := map[netip.Prefix]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) {
			return h.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		for _, r := range rs {
			if p, ok := netipx.FromStdIPNet(r.Dst); ok {
				have[p.Masked()] = r
			}
		}
	}
	var errs []error
	idx := l.Attrs().Index
	for _, w := range want {
		r, ok := have[w.Dst]
		delete(have, w.Dst)
		src, _ := netipx.FromStdIP(r.Src)
		if ok && r.LinkIndex == idx && src == w.Src.Unmap() {
			continue
		}
		nr := &netlink.Route{LinkIndex: idx, Dst: netipx.PrefixIPNet(w.Dst), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN, Scope: netlink.SCOPE_LINK}
		if w.Src.IsValid() {
			nr.Src = w.Src.AsSlice()
		}
		if err := h.RouteReplace(nr); err != nil {
			errs = append(errs, fmt.Errorf("route %s into %s: %w", w.Dst, DeviceName, err))
		}
	}
	for _, r := range have {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// syncAddrs makes addrs the device's only addresses (link-local IPv6 ones
// aside), as host addresses.
func syncAddrs(h *netlink.Handle, l netlink.Link, addrs []netip.Addr) error {
	have, err := link.Retry(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", DeviceName, err)
	}
	want := map[netip.Prefix]bool{}
	for _, a := range addrs {
		want[netip.PrefixFrom(a, a.BitLen())] = true
	}
	for _, a := range have {
		p, ok := netipx.FromStdIPNet(a.IPNet)
		if !ok || p.Addr().IsLinkLocalUnicast() {
			continue
		}
		if want[p] {
			delete(want, p)
			continue
		}
		if err := h.AddrDel(l, &a); err != nil {
			return fmt.Errorf("delete address %s of %s: %w", p, DeviceName, err)
		}
	}
	for p := range want {
		a := &netlink.Addr{IPNet: netipx.PrefixIPNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // a route's source at once
		}
		if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add address %s to %s: %w", p, DeviceName, err)
		}
	}
	return nil
}
