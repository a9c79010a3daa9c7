package nodeview

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// Settings are the node role's settings as its features and explain use
// them, read from the configuration in one place (SettingsOf): how pod
// traffic crosses to other nodes, the cluster's pod CIDRs and the pod MTU.
// What also depends on Nodes (the pod CIDRs' fallback, the MTUs) is a
// method of them, so every feature gets the same answer from the same code.
type Settings struct {
	// Overlay is the overlay's mode: v1alpha1.OverlayCrossSubnet ("" is
	// that default), OverlayAlways or OverlayNever (direct routes only).
	Overlay string
	// Encryption of pod traffic between nodes.
	Encryption Encryption
	// WireGuard is the device's; read with Encryption on only.
	WireGuard WireGuard
	// MTU is --mtu: the pod MTU when set; 0 derives it (PodMTU).
	MTU int
	// clusterCIDRs are --cluster-cidr; empty: every Node's pod CIDRs.
	clusterCIDRs []netip.Prefix
}

// Encryption is how the node encrypts pod traffic to other nodes.
type Encryption uint8

const (
	// NoEncryption: the overlay's paths, direct or VXLAN, in clear.
	NoEncryption Encryption = iota
	// WireGuardStrict: every other node through WireGuard; a node without
	// a valid key is not reached, nothing to the cluster's pod CIDRs
	// leaves in clear, and the overlay steps aside.
	WireGuardStrict
	// WireGuardPermissive: WireGuard to the nodes with a valid key, the
	// overlay's paths in clear to the others (rolling encryption in or
	// out of a running cluster).
	WireGuardPermissive
)

func (e Encryption) String() string {
	switch e {
	case WireGuardStrict:
		return "WireGuard (strict)"
	case WireGuardPermissive:
		return "WireGuard (permissive)"
	}
	return "none"
}

// WireGuard is the WireGuard device's configuration.
type WireGuard struct {
	Port           int
	Implementation string // auto, kernel, userspace
	PrivateKeyFile string
}

// SettingsOf reads the node role's settings from its configuration.
func SettingsOf(n v1alpha1.Node) Settings {
	s := Settings{Overlay: n.Overlay.Mode, MTU: int(n.MTU), clusterCIDRs: sortedPrefixes(n.ClusterCIDRs),
		WireGuard: WireGuard{Port: int(n.Encryption.WireGuardPort), Implementation: n.Encryption.Implementation,
			PrivateKeyFile: n.Encryption.PrivateKeyFile}}
	if s.Overlay == "" {
		s.Overlay = v1alpha1.OverlayCrossSubnet
	}
	if n.Encryption.Mode == v1alpha1.EncryptionWireGuard {
		s.Encryption = WireGuardStrict
		if n.Encryption.Permissive {
			s.Encryption = WireGuardPermissive
		}
	}
	return s
}

// OverlayOff says the overlay steps aside: strict encryption carries all
// pod traffic between nodes.
func (s Settings) OverlayOff() bool { return s.Encryption == WireGuardStrict }

// Tunnelled says VXLAN may carry pod traffic: the overlay is on and its
// mode is not never.
func (s Settings) Tunnelled() bool { return !s.OverlayOff() && s.Overlay != v1alpha1.OverlayNever }

// Dataplane names the paths pod traffic takes to other nodes, for logs:
// "direct", "VXLAN (cross-subnet)", "WireGuard (strict)", "WireGuard
// (permissive) over VXLAN (always)".
func (s Settings) Dataplane() string {
	overlay := "direct"
	if s.Tunnelled() {
		overlay = fmt.Sprintf("VXLAN (%s)", s.Overlay)
	}
	switch s.Encryption {
	case WireGuardStrict:
		return s.Encryption.String()
	case WireGuardPermissive:
		return s.Encryption.String() + " over " + overlay
	}
	return overlay
}

// ClusterCIDRsFromNodes says --cluster-cidr is unset, so the cluster's pod
// CIDRs follow the Nodes (ClusterCIDRs).
func (s Settings) ClusterCIDRsFromNodes() bool { return len(s.clusterCIDRs) == 0 }

// ClusterCIDRs are the cluster's pod CIDRs, sorted: --cluster-cidr, or,
// unset, the pod CIDRs of every Node in nodes. Every feature takes them
// from here: the proxy masquerades ClusterIP traffic from outside them and
// short-circuits traffic from inside them to a Local Service's external
// addresses, the pod network does not masquerade pod traffic to them, and
// strict encryption lets nothing addressed to them leave in clear.
//
// The fallback is the one rule that works for all three: kube-proxy with
// --cluster-cidr unset detects no pod traffic at all (no ClusterIP
// masquerade, no short-circuit), and its NodeCIDR mode takes this node's
// pod CIDRs only; either would masquerade pod traffic to other nodes'
// pods, hiding the pods' addresses from NetworkPolicy there. Nodes only
// hold the pod CIDRs assigned so far, so setting --cluster-cidr also
// covers the addresses of Nodes not yet known.
func (s Settings) ClusterCIDRs(nodes []Node) []netip.Prefix {
	if !s.ClusterCIDRsFromNodes() {
		return s.clusterCIDRs
	}
	var all []netip.Prefix
	for _, n := range nodes {
		all = append(all, n.PodCIDRs...)
	}
	return sortedPrefixes(all)
}

// ClusterCIDRsChange says a change of a Node from old to cur (nil: none)
// changes the cluster's pod CIDRs: without --cluster-cidr, a Node that
// comes, goes or changes its pod CIDRs.
func (s Settings) ClusterCIDRsChange(old, cur *Node) bool {
	if !s.ClusterCIDRsFromNodes() {
		return false
	}
	var before, after []netip.Prefix
	if old != nil {
		before = old.PodCIDRs
	}
	if cur != nil {
		after = cur.PodCIDRs
	}
	return !slices.Equal(before, after)
}

// sortedPrefixes are ps masked, sorted by address then length, without
// repeats, in a new slice.
func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil
	}
	return out
}
