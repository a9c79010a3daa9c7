package overlay

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/sweep"
)

// Cleanup removes what the overlay made in h's namespace, for
// `netplane --role=node --cleanup`: the tunnel devices (their routes,
// neighbour and FDB entries go with them), then the routes of the main
// table with its protocol that remain, the direct ones through the
// underlay.
func Cleanup(s *sweep.Sweep, h Kernel) {
	for _, name := range []string{DeviceV4, DeviceV6} {
		s.Link(h, name, "")
	}
	routes, err := mainRoutes(h)
	if err != nil {
		s.Note(fmt.Sprintf("routes of protocol %d", RouteProtocol), err)
		return
	}
	for _, r := range owned(routes) {
		err := h.RouteDel(&r)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		s.Note(fmt.Sprintf("route %s via %s proto %d", r.Dst, r.Gw, RouteProtocol), err)
	}
}

// owned are the overlay's routes among routes: those of its protocol.
func owned(routes []netlink.Route) []netlink.Route {
	var out []netlink.Route
	for _, r := range routes {
		if r.Protocol == RouteProtocol {
			out = append(out, r)
		}
	}
	return out
}
