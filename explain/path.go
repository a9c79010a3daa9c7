package explain

import (
	"fmt"
	"net/netip"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

// Overlay is what the path between two nodes depends on. The overlay's
// mode is the cluster's; the connected subnets and underlays are the
// source node's, known only on it (Known).
type Overlay struct {
	Mode      string // cross-subnet (default), always, never
	Known     bool
	Connected []netip.Prefix
	Underlays []overlay.Underlay
	// PodMTU is the MTU of the source node's pods, when known.
	PodMTU int
}

// path is how a packet from a pod on node src reaches a pod on node dst,
// as the overlay's own plan for src decides.
func path(src, dst string, nodes []nodeview.Node, fam nodeview.Family, ov Overlay) (kind, text string) {
	switch {
	case src == "" || dst == "":
		return PathUnknown, "the source or the backend is on no node"
	case src == dst:
		return PathSameNode, fmt.Sprintf("same node %s, over the bridge", src)
	}
	cfg := overlay.Config{Mode: overlay.Mode(ov.Mode)}.Defaults()
	if !ov.Known {
		var ip netip.Addr
		for _, n := range nodes {
			if n.Name == dst {
				ip, _ = n.IP(fam)
			}
		}
		switch cfg.Mode {
		case overlay.Always:
			return PathVXLAN, fmt.Sprintf("VXLAN to node %s (%s)", dst, ip)
		case overlay.Never:
			return PathDirect, fmt.Sprintf("direct route to node %s (%s)", dst, ip)
		}
		return PathUnknown, fmt.Sprintf("direct route to node %s (%s) if it is on a subnet of node %s, else VXLAN (run explain on node %s to know)", dst, ip, src, src)
	}
	plan := overlay.Desired(overlay.Input{Config: cfg, Self: src, Nodes: nodes, Connected: ov.Connected, Underlays: ov.Underlays})
	for _, d := range plan.Decisions {
		if d.Node != dst || (d.Family != fam && d.Family != 0) {
			continue
		}
		var via netip.Addr
		for _, r := range plan.Routes {
			if r.Node == dst && nodeview.FamilyOf(r.Dst.Addr()) == fam {
				via = r.Via
			}
		}
		switch d.Path {
		case overlay.Direct:
			return PathDirect, fmt.Sprintf("direct route to node %s via %s", dst, via)
		case overlay.VXLAN:
			return PathVXLAN, fmt.Sprintf("VXLAN to node %s (gateway %s on %s)", dst, via, overlay.DeviceName(fam))
		}
		return PathNone, fmt.Sprintf("no route to node %s: it %s", dst, d.Reason)
	}
	return PathNone, fmt.Sprintf("no route to node %s: it is not in node %s's plan", dst, src)
}
