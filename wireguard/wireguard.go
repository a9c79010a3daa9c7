// Package wireguard encrypts pod traffic between nodes: one WireGuard
// device per node, netplane.wg, with one peer per other node whose public
// key, endpoint and allowed IPs come from that node's Node object.
//
// It owns this node's private key file, the annotation
// netplane.io/wireguard-public-key on this node's own Node, and the device
// netplane.wg in the node's network namespace: the kernel's WireGuard
// where the kernel has it (netlink, through wgctrl), else wireguard-go in
// this process on a TUN device of the same name, configured in-process so
// that no control socket is left in the filesystem.
//
// The core is pure: Desired turns the Node facts into the peer set and the
// pod CIDRs that must be dropped (nodes without a valid key), and Diff
// turns the device's current peers and the desired ones into the smallest
// wgtypes.Config. The shells are the key file (keys.go), the device
// (Device, with a kernel, a userspace and a fake implementation) and the
// Syncer that applies a plan to a Device, incrementally or healing it in
// full.
//
// Routing is not done here: the node role routes the other nodes' pod
// CIDRs, and the Plan's Drop list, into the device. A packet routed into
// the device whose destination no peer allows is dropped by WireGuard
// itself, so a node without a valid key never receives pod traffic in
// clear.
package wireguard

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/netplane/netplane/nodeview"
)

// DeviceName is the WireGuard device of every node.
const DeviceName = nodeview.WireGuardDevice

// DefaultPort is WireGuard's customary UDP port.
const DefaultPort = 51820

// Annotation holds a node's WireGuard public key (base64, as `wg pubkey`
// prints it) on its Node object.
const Annotation = "netplane.io/wireguard-public-key"

// Node is what WireGuard needs of a Node object: the facts the node
// role's Node view keeps for every feature that routes pods, and the key.
type Node struct {
	Name     string
	IPs      []netip.Addr   // InternalIPs, at most one per family
	PodCIDRs []netip.Prefix // spec.podCIDRs, masked
	Key      string         // KeyOf the Node; "" when absent
}

// KeyOf is n's public key annotation as written; a malformed one is kept
// so that the plan can say what is wrong with it.
func KeyOf(n *v1.Node) string { return n.Annotations[Annotation] }

// ipLike is n's InternalIP of a's family, if any.
func (n Node) ipLike(a netip.Addr) (netip.Addr, bool) {
	for _, ip := range n.IPs {
		if ip.Unmap().Is4() == a.Unmap().Is4() {
			return ip.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
