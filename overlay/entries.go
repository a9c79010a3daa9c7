package overlay

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nodeview"
)

// changes are the writes that take the kernel's entries to the plan's:
// sets (create or replace) and deletes of what is ours and not wanted.
// Sets are applied before deletes and neighbours before routes, so a path
// that moves from the tunnel to a direct route, or back, never has a route
// whose neighbour or FDB entry is missing.
type changes struct {
	setFDB, delFDB     []netlink.Neigh
	setNeigh, delNeigh []netlink.Neigh
	setRoute, delRoute []netlink.Route
	routeNodes         map[netip.Prefix]string // for error messages
}

// diffRoutes compares ours (the main table's routes with our protocol)
// with want. tunnels maps device names to indexes.
func (c *changes) diffRoutes(ours []netlink.Route, want []Route, tunnels map[string]int) {
	have := map[netip.Prefix][]netlink.Route{}
	for _, r := range ours {
		if p, ok := routeDst(r); ok {
			have[p] = append(have[p], r)
		}
	}
	c.routeNodes = map[netip.Prefix]string{}
	for _, w := range want {
		c.routeNodes[w.Dst] = w.Node
		cur := have[w.Dst]
		delete(have, w.Dst)
		kept := false
		for _, r := range cur {
			if !kept && routeIs(r, w, tunnels) {
				kept = true
				continue
			}
			if len(cur) > 1 {
				c.delRoute = append(c.delRoute, r) // a duplicate a replace would not remove
			}
		}
		if kept {
			continue
		}
		c.setRoute = append(c.setRoute, kernelRoute(w, tunnels))
	}
	for _, rs := range have {
		c.delRoute = append(c.delRoute, rs...)
	}
}

// kernelRoute is the route w as netlink writes it.
func kernelRoute(w Route, tunnels map[string]int) netlink.Route {
	r := netlink.Route{Dst: netipx.PrefixIPNet(w.Dst), Gw: w.Via.AsSlice(), Protocol: RouteProtocol}
	if w.Device != "" {
		r.LinkIndex = tunnels[w.Device]
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	return r
}

// kernelNeighbour is the permanent neighbour n on the device of index idx.
func kernelNeighbour(n Neighbour, idx int) netlink.Neigh {
	return netlink.Neigh{LinkIndex: idx, Family: families[nodeview.FamilyOf(n.IP)],
		State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: n.MAC}
}

// routeIs says whether the kernel's route r is the planned w: the same
// gateway, and through the tunnel device (onlink) exactly when planned.
func routeIs(r netlink.Route, w Route, tunnels map[string]int) bool {
	if !r.Gw.Equal(w.Via.AsSlice()) || r.Table != unix.RT_TABLE_MAIN {
		return false
	}
	onlink := r.Flags&int(netlink.FLAG_ONLINK) != 0
	if w.Device != "" {
		return onlink && r.LinkIndex == tunnels[w.Device]
	}
	for _, idx := range tunnels {
		if r.LinkIndex == idx {
			return false
		}
	}
	return !onlink
}

// diffNeighbours compares the permanent neighbours of a tunnel device with
// want. Entries the kernel made itself (incomplete, stale) are not ours to
// delete; one for a planned address is replaced.
func (c *changes) diffNeighbours(have []netlink.Neigh, idx int, want []Neighbour) {
	cur := map[netip.Addr]netlink.Neigh{}
	for _, n := range have {
		if a, ok := netip.AddrFromSlice(n.IP); ok && n.State&netlink.NUD_PERMANENT != 0 {
			cur[a.Unmap()] = n
		}
	}
	for _, w := range want {
		n, ok := cur[w.IP]
		delete(cur, w.IP)
		if ok && n.HardwareAddr.String() == w.MAC.String() {
			continue
		}
		c.setNeigh = append(c.setNeigh, kernelNeighbour(w, idx))
	}
	for _, n := range cur {
		c.delNeigh = append(c.delNeigh, n)
	}
}

// diffFDB compares a tunnel device's forwarding entries with want. An
// entry is a (MAC, destination) pair: the kernel keeps a list of
// destinations per MAC, and a stray one would send copies elsewhere.
func (c *changes) diffFDB(have []netlink.Neigh, idx int, want []FDBEntry) {
	type pair struct {
		mac string
		dst netip.Addr
	}
	cur := map[pair]netlink.Neigh{}
	for _, n := range have {
		a, _ := netip.AddrFromSlice(n.IP)
		cur[pair{n.HardwareAddr.String(), a.Unmap()}] = n
	}
	for _, w := range want {
		k := pair{w.MAC.String(), w.Dst}
		n, ok := cur[k]
		delete(cur, k)
		if ok && n.State&netlink.NUD_PERMANENT != 0 {
			continue
		}
		c.setFDB = append(c.setFDB, fdbEntry(idx, w.MAC, w.Dst))
	}
	for _, n := range cur {
		c.delFDB = append(c.delFDB, n)
	}
}

func fdbEntry(idx int, mac net.HardwareAddr, dst netip.Addr) netlink.Neigh {
	return netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, IP: dst.AsSlice(), HardwareAddr: mac}
}

// apply writes the changes in their order; a failed write is reported and
// the others still made.
func (c *changes) apply(h Kernel) error {
	var errs []error
	for _, n := range c.setFDB {
		if err := h.NeighSet(&n); err != nil {
			errs = append(errs, fmt.Errorf("fdb %s dst %s: %w", n.HardwareAddr, n.IP, err))
		}
	}
	for _, n := range c.setNeigh {
		if err := h.NeighSet(&n); err != nil {
			errs = append(errs, fmt.Errorf("neighbour %s lladdr %s: %w", n.IP, n.HardwareAddr, err))
		}
	}
	for _, r := range c.setRoute {
		if err := h.RouteReplace(&r); err != nil {
			p, _ := routeDst(r)
			errs = append(errs, fmt.Errorf("route %s via %s (node %s): %w", r.Dst, r.Gw, c.routeNodes[p.Masked()], err))
		}
	}
	for _, r := range c.delRoute {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s via %s: %w", r.Dst, r.Gw, err))
		}
	}
	for _, n := range c.delNeigh {
		if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete neighbour %s: %w", n.IP, err))
		}
	}
	for _, n := range c.delFDB {
		if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete fdb %s dst %s: %w", n.HardwareAddr, n.IP, err))
		}
	}
	return errors.Join(errs...)
}

// routeDst is a route's destination; false for a default route (no Dst).
func routeDst(r netlink.Route) (netip.Prefix, bool) {
	if r.Dst == nil {
		return netip.Prefix{}, false
	}
	return netipx.FromStdIPNet(r.Dst)
}

// deltaChanges are the writes of d: nothing is read, the kernel is taken
// to hold the plan d starts from. tunnels maps device names to indexes.
func deltaChanges(d Delta, tunnels map[string]int) *changes {
	c := &changes{routeNodes: map[netip.Prefix]string{}}
	for _, r := range d.Routes {
		c.routeNodes[r.Dst] = r.Node
		c.setRoute = append(c.setRoute, kernelRoute(r, tunnels))
	}
	for _, r := range d.DelRoutes {
		k := kernelRoute(r, tunnels)
		k.Table = unix.RT_TABLE_MAIN
		c.delRoute = append(c.delRoute, k)
	}
	for _, n := range d.Neighbours {
		c.setNeigh = append(c.setNeigh, kernelNeighbour(n, tunnels[n.Device]))
	}
	for _, n := range d.DelNeighbours {
		c.delNeigh = append(c.delNeigh, kernelNeighbour(n, tunnels[n.Device]))
	}
	for _, f := range d.FDB {
		c.setFDB = append(c.setFDB, fdbEntry(tunnels[f.Device], f.MAC, f.Dst))
	}
	for _, f := range d.DelFDB {
		c.delFDB = append(c.delFDB, fdbEntry(tunnels[f.Device], f.MAC, f.Dst))
	}
	return c
}
