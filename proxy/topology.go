package proxy

import "slices"

// categorized is the endpoint choice for one servicePort on this node, as
// kube-proxy's CategorizeEndpoints makes it.
type categorized struct {
	Cluster []endpoint // for Cluster-policy traffic (after topology)
	Local   []endpoint // for Local-policy traffic
	Any     bool       // some usable endpoint exists anywhere
}

// categorize picks the endpoints traffic may go to: ready ones, or when
// there are none, serving-and-terminating ones (so connections drain rather
// than fail); for Cluster traffic narrowed by topology hints when every
// ready endpoint carries them and one matches this node or zone.
func categorize(sp *servicePort, eps []endpoint, node, zone string) categorized {
	var c categorized
	if sp.usesClusterEndpoints() {
		byNode, byZone := topologyMode(eps, node, zone)
		c.Cluster = filter(eps, func(e endpoint) bool {
			switch {
			case !e.Ready:
				return false
			case byNode:
				return slices.Contains(e.NodeHints, node)
			case byZone:
				return slices.Contains(e.ZoneHints, zone)
			}
			return true
		})
		if len(c.Cluster) == 0 {
			c.Cluster = filter(eps, func(e endpoint) bool { return e.Serving && e.Terminating })
		}
		c.Any = len(c.Cluster) > 0
	}
	if !sp.usesLocalEndpoints() {
		return c
	}
	for _, e := range eps {
		if e.Ready || e.Serving && e.Terminating {
			c.Any = true
		}
	}
	c.Local = filter(eps, func(e endpoint) bool { return e.Local && e.Ready })
	if len(c.Local) == 0 {
		c.Local = filter(eps, func(e endpoint) bool { return e.Local && e.Serving && e.Terminating })
	}
	return c
}

// topologyMode decides whether node hints or zone hints apply, as
// kube-proxy's topologyModeFromHints does. Node hints apply when every
// ready endpoint has node hints and one names this node; failing that,
// zone hints when every ready endpoint has zone hints and one names this
// zone. Otherwise narrowing could black-hole traffic, so all endpoints are
// used.
func topologyMode(eps []endpoint, node, zone string) (byNode, byZone bool) {
	allNode, allZone, forNode, forZone := true, true, false, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		allNode = allNode && len(e.NodeHints) > 0
		allZone = allZone && len(e.ZoneHints) > 0
		forNode = forNode || slices.Contains(e.NodeHints, node)
		forZone = forZone || zone != "" && slices.Contains(e.ZoneHints, zone)
	}
	if allNode && forNode {
		return true, false
	}
	return false, allZone && forZone
}

// filter returns the endpoints keep accepts: eps itself when it accepts
// all (the common case, and results are only read), else a new slice.
func filter(eps []endpoint, keep func(endpoint) bool) []endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	if n == len(eps) || n == 0 {
		return eps[:n]
	}
	out := make([]endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
