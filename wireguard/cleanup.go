package wireguard

import (
	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/sweep"
)

// Cleanup removes what the feature made in h's namespace and on disk, for
// `netplane --role=node --cleanup`: what removeKernel removes, and the
// private key file keyFile. The key annotation on the Node is the API
// server's, out of a node's reach once the chart is gone; it goes with
// the Node.
func Cleanup(s *sweep.Sweep, h *netlink.Handle, keyFile string) {
	removeKernel(s, h)
	s.File(keyFile)
}

// removeKernel removes the device (the routes through it go with it),
// what remains of its routing table with the rules that look it up, and
// the guard table; for the userspace implementation, the device is its
// persistent TUN device.
func removeKernel(s *sweep.Sweep, h *netlink.Handle) {
	s.Link(h, DeviceName, "")
	removeRouting(s, h)
	s.Table(GuardTable)
}
