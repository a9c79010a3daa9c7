package overlay

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/netplane/netplane/nodeview"
)

// Update is the plan after one Node changed, computed from that Node alone
// and the plan before (prev), with what must be written to get there: a
// Node event then costs that Node's entries, not a plan of every node.
// in holds the Config, Connected and Underlays prev was planned with, and
// this node in Nodes; n is the changed Node's facts, gone when its Node
// was deleted. ok is false when the change may alter the plan of other
// nodes, and only Desired over every node is right: a change of this node
// (its addresses and pod CIDRs shape every path), a pod CIDR overlap or a
// tunnel MAC shared with another node (who keeps the route depends on
// both), or prev holding such a conflict (the update may resolve it).
func Update(prev Plan, in Input, n nodeview.Node, gone bool) (next Plan, d Delta, ok bool) {
	if n.Name == in.Self || slices.ContainsFunc(prev.Decisions, func(d Decision) bool { return d.conflict }) {
		return Plan{}, Delta{}, false
	}
	var cur Plan
	if !gone {
		b := builder{in: in, plan: &cur, devices: map[nodeview.Family]*Device{}, macs: map[string]string{},
			claimed: map[netip.Prefix]string{}, within: map[netip.Prefix]string{}}
		if !b.seed(prev, n) {
			return Plan{}, Delta{}, false
		}
		b.addNode(n)
		if slices.ContainsFunc(cur.Decisions, func(d Decision) bool { return d.conflict }) {
			return Plan{}, Delta{}, false
		}
	}
	old := prev.of(n.Name)
	next = prev.without(n.Name)
	next.Routes = append(next.Routes, cur.Routes...)
	next.Neighbours = append(next.Neighbours, cur.Neighbours...)
	next.FDB = append(next.FDB, cur.FDB...)
	next.Decisions = append(next.Decisions, cur.Decisions...)
	next.sort()
	return next, Diff(old, cur), true
}

// seed gives a builder for node n what prev says of the others, and only
// what n could clash with: the devices, this node's pod CIDRs, the routed
// pod CIDRs that overlap one of n's, the tunnel MACs equal to one of n's.
// A scan of prev, so no index of every node is built per change.
func (b *builder) seed(prev Plan, n nodeview.Node) bool {
	i := slices.IndexFunc(b.in.Nodes, func(m nodeview.Node) bool { return m.Name == b.in.Self })
	if i < 0 {
		return false
	}
	b.self = b.in.Nodes[i]
	for _, c := range b.self.PodCIDRs {
		b.claim(c, b.self.Name)
	}
	for _, d := range prev.Devices {
		b.devices[d.Family] = &d
		b.macs[d.MAC.String()] = b.self.Name
	}
	for _, r := range prev.Routes {
		if r.Node != n.Name && slices.ContainsFunc(n.PodCIDRs, r.Dst.Overlaps) {
			b.claim(r.Dst, r.Node)
		}
	}
	var macs []string
	for _, ip := range n.IPs {
		macs = append(macs, MAC(ip).String())
	}
	for _, f := range prev.FDB {
		if m := f.MAC.String(); f.Node != n.Name && slices.Contains(macs, m) {
			b.macs[m] = f.Node
		}
	}
	return true
}

// of is the part of p that is these nodes': their routes, entries and
// decisions.
func (p Plan) of(nodes ...string) Plan {
	return p.filter(func(n string) bool { return slices.Contains(nodes, n) })
}

// without is p less node's part.
func (p Plan) without(node string) Plan {
	p2 := p.filter(func(n string) bool { return n != node })
	p2.Devices = slices.Clone(p.Devices)
	return p2
}

func (p Plan) filter(keep func(node string) bool) Plan {
	return Plan{
		Routes:     keepBy(p.Routes, func(r Route) bool { return keep(r.Node) }),
		Neighbours: keepBy(p.Neighbours, func(n Neighbour) bool { return keep(n.Node) }),
		FDB:        keepBy(p.FDB, func(f FDBEntry) bool { return keep(f.Node) }),
		Decisions:  keepBy(p.Decisions, func(d Decision) bool { return keep(d.Node) }),
	}
}

// keepBy are the elements of all for which keep is true, in order.
func keepBy[E any](all []E, keep func(E) bool) []E {
	var out []E
	for _, e := range all {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// Delta is what takes the kernel from one plan's routes and entries to
// another's: entries to set (new or changed) and to delete.
type Delta struct {
	Routes, DelRoutes         []Route
	Neighbours, DelNeighbours []Neighbour
	FDB, DelFDB               []FDBEntry
}

// Diff is the delta from prev to cur. A route is keyed by its destination,
// a neighbour by device and address, an FDB entry by device, MAC and
// destination.
func Diff(prev, cur Plan) Delta {
	var d Delta
	d.Routes, d.DelRoutes = diffBy(prev.Routes, cur.Routes, func(r Route) string { return r.Dst.String() },
		func(a, b Route) bool { return a == b })
	d.Neighbours, d.DelNeighbours = diffBy(prev.Neighbours, cur.Neighbours,
		func(n Neighbour) string { return n.Device + " " + n.IP.String() },
		func(a, b Neighbour) bool { return a.MAC.String() == b.MAC.String() })
	d.FDB, d.DelFDB = diffBy(prev.FDB, cur.FDB,
		func(f FDBEntry) string { return f.Device + " " + f.MAC.String() + " " + f.Dst.String() },
		func(FDBEntry, FDBEntry) bool { return true })
	return d
}

// diffBy are the elements of cur that prev lacks or has otherwise (same
// key, not same), and those of prev whose key cur lacks.
func diffBy[E any](prev, cur []E, key func(E) string, same func(a, b E) bool) (set, del []E) {
	old := map[string]E{}
	for _, e := range prev {
		old[key(e)] = e
	}
	for _, e := range cur {
		k := key(e)
		if o, ok := old[k]; !ok || !same(o, e) {
			set = append(set, e)
		}
		delete(old, k)
	}
	for _, e := range prev {
		if _, ok := old[key(e)]; ok {
			del = append(del, e)
		}
	}
	return set, del
}

// Empty says whether d writes nothing.
func (d Delta) Empty() bool {
	return len(d.Routes)+len(d.DelRoutes)+len(d.Neighbours)+len(d.DelNeighbours)+len(d.FDB)+len(d.DelFDB) == 0
}

// String dumps d as Plan.String does, deletes prefixed with "del".
func (d Delta) String() string {
	var b strings.Builder
	set := Plan{Routes: d.Routes, Neighbours: d.Neighbours, FDB: d.FDB}.String()
	b.WriteString(set)
	for _, line := range strings.SplitAfter(Plan{Routes: d.DelRoutes, Neighbours: d.DelNeighbours, FDB: d.DelFDB}.String(), "\n") {
		if line != "" {
			fmt.Fprintf(&b, "del %s", line)
		}
	}
	return b.String()
}
