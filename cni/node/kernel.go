package node

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/cni/link"
	"github.com/netplane/netplane/cni/nft"
)

// MasqTable is the inet table for pod egress: separate from the proxy's
// `netplane` table and the plugin's hostPort table, so each owner rewrites
// only its own.
const MasqTable = "netplane-pods"

// routeProtocol marks the routes this agent owns (rtnetlink protocol
// number), so it can find and remove its stale routes and never touches
// anyone else's.
const routeProtocol netlink.RouteProtocol = 207

// programMasquerade writes the table for p:
//
//	postrouting (srcnat): from a pod of this node to an exempt CIDR: return;
//	                      from a pod of this node elsewhere: masquerade
//	forward (filter): pod traffic either way is accepted
func programMasquerade(p masqPlan) error {
	return nft.Replace(MasqTable, func(c *nftables.Conn, t *nftables.Table) {
		post := nft.Chain(c, t, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
		fwd := nft.Chain(c, t, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
		for _, src := range p.Sources {
			for _, ex := range p.Exempt {
				if ex.Addr().Is4() == src.Addr().Is4() {
					nft.Rule(c, post, nft.InPrefix(src, false, false), nft.InPrefix(ex, true, false), nft.Return())
				}
			}
			nft.Rule(c, post, nft.InPrefix(src, false, false), nft.Masquerade())
		}
		for _, ex := range append(slices.Clone(p.Sources), p.Exempt...) {
			nft.Rule(c, fwd, nft.InPrefix(ex, false, false), nft.Accept())
			nft.Rule(c, fwd, nft.InPrefix(ex, true, false), nft.Accept())
		}
	})
}

// onLink reports whether ip is reachable without a gateway (same L2).
func onLink(h *netlink.Handle, ip netip.Addr) (bool, error) {
	rs, err := h.RouteGet(ip.AsSlice())
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if r.Gw != nil {
			return false, nil
		}
	}
	return len(rs) > 0, nil
}

// syncRoutes makes our routes exactly want: missing or changed ones are
// replaced, ours that are no longer wanted are deleted.
func syncRoutes(h *netlink.Handle, want []route) error {
	var errs []error
	have := map[netip.Prefix]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := link.Retry(func() ([]netlink.Route, error) {
			return h.RouteListFiltered(fam, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil {
				continue // a default route, which the agent never makes
			}
			if p, ok := netipx.FromStdIPNet(r.Dst); ok {
				have[p] = r
			}
		}
	}
	for _, w := range want {
		cur, ok := have[w.Dst]
		delete(have, w.Dst)
		if ok && cur.Gw.Equal(net.IP(w.Via.AsSlice())) {
			continue
		}
		r := &netlink.Route{Dst: netipx.PrefixIPNet(w.Dst), Gw: w.Via.AsSlice(), Protocol: routeProtocol}
		if err := h.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s (node %s): %w", w.Dst, w.Via, w.Node, err))
		}
	}
	for _, stale := range have {
		if err := h.RouteDel(&stale); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete stale route %s: %w", stale.Dst, err))
		}
	}
	return errors.Join(errs...)
}
