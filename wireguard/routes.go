package wireguard

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/sweep"
)

// The routes into the device live in a routing table of their own,
// looked up before the main table (rule priority RulePriority): in
// permissive mode the overlay's routes stay in the main table beside them,
// for the nodes that are no peers, and neither feature ever meets the
// other's routes.
const (
	RouteTable    = 208
	RulePriority  = 100
	RouteProtocol = 208 // rtnetlink protocol of the routes, as the overlay marks its own 207
)

// Route is one route of the table: a prefix into the device (Src, when
// valid, the source the node's own packets to it leave from), or with
// Throw, a prefix sent on to the main table.
type Route struct {
	Dst   netip.Prefix
	Src   netip.Addr
	Throw bool
}

// Routes is the routing table: this node's own pod CIDRs thrown back to
// the main table (to the bridge), and into the device every peer's
// allowed IPs and, when strict, the plan's Drop list (no peer allows
// them: WireGuard drops what reaches it) and the cluster's pod CIDRs,
// which catch the pod addresses of no known node the same way. Each takes
// as source the address of its family among own (this node's addresses
// on the device, from its pod CIDRs), so that what the node sends into the
// tunnel comes from an address its peers allow. Sorted, without repeats.
func Routes(plan Plan, cluster, mine []netip.Prefix, own []netip.Addr, strict bool) []Route {
	var dsts []netip.Prefix
	for _, p := range plan.Peers {
		dsts = append(dsts, p.AllowedIPs...)
	}
	if strict {
		dsts = append(dsts, plan.Drop...)
		dsts = append(dsts, cluster...)
	}
	var out []Route
	for _, d := range mine {
		out = append(out, Route{Dst: d.Masked(), Throw: true})
	}
	for _, d := range dsts {
		d = d.Masked()
		if slices.ContainsFunc(out, func(r Route) bool { return r.Dst == d }) {
			continue
		}
		r := Route{Dst: d}
		for _, a := range own {
			if a.Is4() == d.Addr().Is4() {
				r.Src = a
				break
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return out
}

// DeviceAddrs are this node's addresses on the device: the network
// address of each of its pod CIDRs, as the overlay's tunnel devices hold
// it. The bridge holds the first address; a host address may be on two
// interfaces, but one of its own keeps the device independent of the pod
// network's order of start.
func DeviceAddrs(podCIDRs []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, f := range nodeview.Families {
		if a, ok := nodeview.TunnelAddr(podCIDRs, f); ok {
			out = append(out, a)
		}
	}
	return out
}

// syncLink puts exactly addrs (as host addresses) on the device's link,
// makes the table, whose routes are have (tableRoutes; syncLink takes them
// over), exactly want, and the rules that look it up. A route that
// differs is replaced in place, so a prefix never goes without one.
func syncLink(h *netlink.Handle, l netlink.Link, addrs []netip.Addr, have map[netip.Prefix]netlink.Route, want []Route) error {
	if err := syncAddrs(h, l, addrs); err != nil {
		return err
	}
	var errs []error
	idx := l.Attrs().Index
	for _, w := range want {
		r, ok := have[w.Dst]
		delete(have, w.Dst)
		if ok && sameRoute(r, w, idx) {
			continue
		}
		nr := &netlink.Route{LinkIndex: idx, Dst: netipx.PrefixIPNet(w.Dst), Protocol: RouteProtocol, Table: RouteTable, Scope: netlink.SCOPE_LINK}
		if w.Throw {
			nr = &netlink.Route{Dst: netipx.PrefixIPNet(w.Dst), Protocol: RouteProtocol, Table: RouteTable, Type: unix.RTN_THROW}
		} else if w.Src.IsValid() {
			nr.Src = w.Src.AsSlice()
		}
		if err := h.RouteReplace(nr); err != nil {
			errs = append(errs, fmt.Errorf("route %s in table %d: %w", w.Dst, RouteTable, err))
		}
	}
	for _, r := range have {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	return errors.Join(append(errs, ensureRules(h))...)
}

func sameRoute(r netlink.Route, w Route, idx int) bool {
	if w.Throw {
		return r.Type == unix.RTN_THROW
	}
	src, _ := netipx.FromStdIP(r.Src)
	return r.Type == unix.RTN_UNICAST && r.LinkIndex == idx && src == w.Src.Unmap()
}

// tableRoutes are the routes of the table, both families, by prefix.
func tableRoutes(h *netlink.Handle) (map[netip.Prefix]netlink.Route, error) {
	have := map[netip.Prefix]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) {
			return h.RouteListFiltered(fam, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return nil, fmt.Errorf("list routes of table %d: %w", RouteTable, err)
		}
		for _, r := range rs {
			if p, ok := netipx.FromStdIPNet(r.Dst); ok {
				have[p.Masked()] = r
			}
		}
	}
	return have, nil
}

// ensureRules makes the rule of each family that looks the table up.
func ensureRules(h *netlink.Handle) error {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := link.Retry(func() ([]netlink.Rule, error) {
			return h.RuleListFiltered(fam, &netlink.Rule{Table: RouteTable}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return fmt.Errorf("list rules: %w", err)
		}
		if slices.ContainsFunc(rules, func(r netlink.Rule) bool { return r.Priority == RulePriority }) {
			continue
		}
		r := netlink.NewRule()
		r.Family, r.Table, r.Priority = fam, RouteTable, RulePriority
		if err := h.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add rule %d lookup %d: %w", RulePriority, RouteTable, err)
		}
	}
	return nil
}

// removeRouting deletes the rules that look the table up and every route
// of the table, noting each in s.
func removeRouting(s *sweep.Sweep, h *netlink.Handle) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		name := map[int]string{netlink.FAMILY_V4: "IPv4", netlink.FAMILY_V6: "IPv6"}[fam]
		rules, err := link.Retry(func() ([]netlink.Rule, error) {
			return h.RuleListFiltered(fam, &netlink.Rule{Table: RouteTable}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			s.Note(fmt.Sprintf("%s rules looking up table %d", name, RouteTable), err)
			continue
		}
		for i := range rules {
			s.Note(fmt.Sprintf("%s rule %d lookup %d", name, rules[i].Priority, RouteTable), h.RuleDel(&rules[i]))
		}
	}
	have, err := tableRoutes(h)
	if err != nil {
		s.Note(fmt.Sprintf("routes of table %d", RouteTable), err)
		return
	}
	for _, dst := range slices.SortedFunc(maps.Keys(have), comparePrefix) {
		r := have[dst]
		if err := h.RouteDel(&r); !errors.Is(err, unix.ESRCH) {
			s.Note(fmt.Sprintf("route %s table %d", dst, RouteTable), err)
		}
	}
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
