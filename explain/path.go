package explain

import (
	"fmt"
	"net/netip"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/wireguard"
)

// Overlay is what the path between two nodes depends on. The node
// role's settings are the cluster's; the connected subnets and underlays
// are the source node's, known only on it (Known).
type Overlay struct {
	// Settings are the node role's (its configuration, as the role reads
	// it): the overlay's mode and the encryption.
	Settings  nodeview.Settings
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
	clear := ""
	if enc := ov.Settings.Encryption; enc != nodeview.NoEncryption {
		kind, text, why := tunnel(src, dst, nodes, ov)
		switch {
		case kind != "":
			return kind, text
		case enc == nodeview.WireGuardStrict:
			return PathNone, "dropped: " + why
		}
		clear = "in clear (permissive encryption; " + why + "): "
	}
	kind, text = overlayPath(src, dst, nodes, fam, ov)
	return kind, clear + text
}

// tunnel is the WireGuard path from node src to node dst, as src's peer
// plan has it, or why dst is no peer of src.
func tunnel(src, dst string, nodes []nodeview.Node, ov Overlay) (kind, text, why string) {
	in := wireguard.Input{Self: src, Port: ov.Settings.WireGuard.Port}
	if in.Port == 0 {
		in.Port = wireguard.DefaultPort
	}
	in.Nodes = wireguard.Facts(nodes)
	for _, n := range nodes {
		if n.Name == src {
			in.Underlay, _ = n.WireGuardUnderlay()
			in.PublicKey, _ = wgtypes.ParseKey(n.Annotations[wireguard.Annotation])
		}
	}
	plan := wireguard.Desired(in)
	for _, p := range plan.Peers {
		if p.Node == dst {
			return PathWireGuard, fmt.Sprintf("WireGuard to node %s (%s on %s)", dst, p.Endpoint, wireguard.DeviceName), ""
		}
	}
	for _, r := range plan.Rejected {
		if r.Node == dst {
			return "", "", r.Detail
		}
	}
	return "", "", fmt.Sprintf("node %s is no WireGuard peer of node %s", dst, src)
}

// overlayPath is the overlay's path from node src to node dst.
func overlayPath(src, dst string, nodes []nodeview.Node, fam nodeview.Family, ov Overlay) (kind, text string) {
	cfg := overlay.Config{Mode: overlay.Mode(ov.Settings.Overlay)}.Defaults()
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
