// Package overlay routes pod traffic to the other nodes of the cluster: a
// plain route to a node that shares a connected subnet with this one, a
// VXLAN tunnel to a node that does not, so a cluster may span subnets
// joined by routers that know nothing of pod CIDRs.
//
// It owns, in the node's network namespace: the devices netplane.vxlan
// (IPv4 underlay) and netplane.vxlan6 (IPv6 underlay), every route of the
// main table with route protocol 207, and the neighbour and FDB entries on
// those two devices. It touches nothing else.
//
// The core (Desired) is a pure function of the Node facts (package
// nodeview, which the pod network reads too) and a few facts of the kernel; the shell (Syncer) converges the kernel to it. Everything
// a node needs to reach another is computed from the other node's Node
// object alone (its InternalIP and spec.podCIDRs): the tunnel MAC of a node
// is derived from its address, so nothing is written to the API server.
//
// Scheme, per remote node R reached by VXLAN (IPv4 shown):
//
//	route     <R pod CIDR> via <R InternalIP> dev netplane.vxlan onlink  proto 207
//	neighbour <R InternalIP> lladdr MAC(R InternalIP) dev netplane.vxlan permanent
//	fdb       MAC(R InternalIP) dst <R InternalIP> dev netplane.vxlan self permanent
//
// The gateway is derived from the remote node's InternalIP rather than from
// its pod CIDR (Flannel routes via the pod CIDR's network address): one
// neighbour per node and family then serves every pod CIDR of that node, a
// pod CIDR change touches only routes, and for IPv4 `ip route` names the
// node a route goes to. The gateway is only a key into the device's
// neighbour table; the outer packet is routed by the main table. For IPv6
// the gateway is the link-local address of the remote tunnel MAC, which
// the kernel accepts on the tunnel device whatever other routes exist (see
// Gateway).
//
// The device carries one address: the network address of this node's pod
// CIDR of its family, as a host address (/32, /128). Traffic the node
// itself sends to a remote pod then leaves with that source, the remote
// node routes the reply back through the tunnel, and the path is symmetric,
// which strict reverse-path filtering needs.
package overlay

import (
	"fmt"

	"github.com/netplane/netplane/nodeview"
)

// Mode says which remote nodes are reached through the tunnel.
type Mode string

const (
	// CrossSubnet routes directly to nodes on a connected subnet, through
	// VXLAN to the others.
	CrossSubnet Mode = "cross-subnet"
	// Always reaches every other node through VXLAN.
	Always Mode = "always"
	// Never routes directly only; nodes off every connected subnet are
	// reported unroutable.
	Never Mode = "never"
)

// Defaults of Config: the IANA VXLAN port, and VNI 1.
const (
	DefaultPort = 4789
	DefaultVNI  = 1
)

// Device names, per underlay family. Anything else is never touched.
const (
	DeviceV4 = nodeview.VXLANDeviceV4
	DeviceV6 = nodeview.VXLANDeviceV6
)

// RouteProtocol marks the routes this package owns (rtnetlink protocol
// number), so a restarted agent adopts them instead of duplicating them.
const RouteProtocol = 207

// Config is how the overlay is set up; the same on every node.
type Config struct {
	Mode Mode
	Port int // UDP destination port of the tunnel
	VNI  int // VXLAN network identifier
	// Off steps the overlay aside: another feature carries every packet
	// to other nodes' pods (WireGuard, with encryption on), so no route,
	// tunnel device or entry to another node is planned, and the ones
	// left from before are removed.
	Off bool
}

// Defaults fills unset fields.
func (c Config) Defaults() Config {
	if c.Mode == "" {
		c.Mode = CrossSubnet
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	return c
}

// Validate says what is wrong with c (after Defaults).
func (c Config) Validate() error {
	switch c.Mode {
	case CrossSubnet, Always, Never:
	default:
		return fmt.Errorf("overlay mode %q is not one of cross-subnet, always, never", c.Mode)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("overlay UDP port %d is not in 1..65535", c.Port)
	}
	if c.VNI < 1 || c.VNI > 1<<24-1 {
		return fmt.Errorf("overlay VNI %d is not in 1..16777215", c.VNI)
	}
	return nil
}

// DeviceName is the tunnel device of an underlay family.
func DeviceName(f nodeview.Family) string {
	if f == nodeview.IPv6 {
		return DeviceV6
	}
	return DeviceV4
}
