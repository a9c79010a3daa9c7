package overlay

import (
	"fmt"
	"strings"
)

// String dumps the plan in the words of `ip` and `bridge`, one object a
// line, so a test failure reads as a diff of kernel state.
func (p Plan) String() string {
	var b strings.Builder
	for _, d := range p.Devices {
		fmt.Fprintf(&b, "link %s vxlan id %d dstport %d dev #%d local %s nolearning address %s mtu %d",
			d.Name, d.VNI, d.Port, d.Underlay, d.Local, d.MAC, d.MTU)
		if d.Addr.IsValid() {
			fmt.Fprintf(&b, " addr %s", d.Addr)
		}
		b.WriteByte('\n')
	}
	for _, r := range p.Routes {
		if r.Device == "" {
			fmt.Fprintf(&b, "route %s via %s (%s)\n", r.Dst, r.Via, r.Node)
		} else {
			fmt.Fprintf(&b, "route %s via %s dev %s onlink (%s)\n", r.Dst, r.Via, r.Device, r.Node)
		}
	}
	for _, n := range p.Neighbours {
		fmt.Fprintf(&b, "neigh %s lladdr %s dev %s\n", n.IP, n.MAC, n.Device)
	}
	for _, f := range p.FDB {
		fmt.Fprintf(&b, "fdb %s dst %s dev %s\n", f.MAC, f.Dst, f.Device)
	}
	for _, d := range p.Decisions {
		fmt.Fprintf(&b, "node %s %s %s", d.Node, d.Family, d.Path)
		if d.Reason != "" {
			fmt.Fprintf(&b, ": %s", d.Reason)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
