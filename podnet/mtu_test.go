package podnet

import (
	"net/netip"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/nodeview"
)

func TestPodMTULeavesRoomForThePathToOtherNodes(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")
	for _, tc := range []struct {
		name       string
		encryption string
		overlay    string
		explicit   int32
		ips        []netip.Addr // the Node's InternalIPs, the first one the tunnel's
		want       int
	}{
		{"VXLAN, IPv4 underlay", v1alpha1.EncryptionNone, v1alpha1.OverlayCrossSubnet, 0, []netip.Addr{v4}, 1450},
		{"no tunnel: the underlay's", v1alpha1.EncryptionNone, v1alpha1.OverlayNever, 0, []netip.Addr{v4}, 1500},
		{"WireGuard, IPv4 underlay: 60 bytes", v1alpha1.EncryptionWireGuard, v1alpha1.OverlayCrossSubnet, 0, []netip.Addr{v4}, 1440},
		{"WireGuard, IPv6 underlay: 80 bytes", v1alpha1.EncryptionWireGuard, v1alpha1.OverlayCrossSubnet, 0, []netip.Addr{v6, v4}, 1420},
		{"WireGuard whatever the overlay's mode", v1alpha1.EncryptionWireGuard, v1alpha1.OverlayNever, 0, []netip.Addr{v4}, 1440},
		{"--mtu wins", v1alpha1.EncryptionWireGuard, v1alpha1.OverlayCrossSubnet, 1300, []netip.Addr{v4}, 1300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel()
			k.addLink("eth0", "veth", 1500, netip.MustParsePrefix("192.168.1.10/24"), netip.MustParsePrefix("fd00::10/64"))
			cfg := v1alpha1.Node{MTU: tc.explicit}
			cfg.Encryption.Mode, cfg.Overlay.Mode = tc.encryption, tc.overlay
			got, err := PodMTU(k, cfg, nodeview.Node{Name: "self", IPs: tc.ips})
			if err != nil || got != tc.want {
				t.Errorf("PodMTU = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
