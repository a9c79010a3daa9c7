package overlay_test

import (
	"net"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/overlay"
	"github.com/netplane/netplane/sweep"
)

// Cleanup on node1 in memory, after a sync of each mode: only what was
// there before the overlay (eth0, its default route, a static route of
// someone else's) is left, and a second cleanup finds nothing.
func TestCleanupLeavesOnlyWhatWasNotTheOverlays(t *testing.T) {
	const others = "route 10.99.0.0/24 via 192.168.10.1 dev eth0 proto 4\n"
	for _, tc := range []struct {
		cfg     overlay.Config
		removed []string
	}{
		{overlay.Config{Mode: overlay.CrossSubnet}, []string{"link netplane.vxlan", "route 10.244.2.0/24 via 192.168.10.12 proto 207"}},
		{overlay.Config{Mode: overlay.Always}, []string{"link netplane.vxlan"}},
		{overlay.Config{Mode: overlay.Never}, []string{"route 10.244.2.0/24 via 192.168.10.12 proto 207"}},
	} {
		t.Run(string(tc.cfg.Mode), func(t *testing.T) {
			n := newFakeNode(t, tc.cfg)
			_, dst, _ := net.ParseCIDR("10.99.0.0/24")
			must(t, n.k.RouteReplace(&netlink.Route{Dst: dst, Gw: net.ParseIP("192.168.10.1"), Protocol: 4}))
			if _, err := n.s.Sync("node1", n.nodes); err != nil {
				t.Fatal(err)
			}
			var s sweep.Sweep
			overlay.Cleanup(&s, n.k)
			if got := n.k.Dump(); got != eth0+dflt+others {
				t.Errorf("after cleanup:\n%swant:\n%s", got, eth0+dflt+others)
			}
			if !slices.Equal(s.Removed(), tc.removed) || s.Err() != nil {
				t.Errorf("removed %q (%v), want %q", s.Removed(), s.Err(), tc.removed)
			}
			var again sweep.Sweep
			overlay.Cleanup(&again, n.k)
			if len(again.Removed()) != 0 || again.Err() != nil {
				t.Errorf("second cleanup removed %q (%v), want nothing", again.Removed(), again.Err())
			}
		})
	}
}
