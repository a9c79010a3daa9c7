package nodeview

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/link"
)

// fakeUnderlay is the kernel as UnderlayMTU reads it: the interfaces by
// the addresses they hold, and the default route's MTU.
type fakeUnderlay struct {
	addrs        map[netip.Addr]link.Interface
	defaultRoute int
	err          error // of every address look-up
}

func (f fakeUnderlay) InterfaceOf(ip netip.Addr) (link.Interface, bool, error) {
	if f.err != nil {
		return link.Interface{}, false, f.err
	}
	i, ok := f.addrs[ip]
	return i, ok, nil
}

func (f fakeUnderlay) DefaultRouteMTU() int { return f.defaultRoute }

// TestTheNodesMTUs is every combination of underlay (families, which one
// the node lists first, interface MTUs, none found), dataplane and --mtu:
// the underlay's MTU, and the pods' (and WireGuard device's), which leave
// room for the largest overhead of the paths pod traffic may take.
func TestTheNodesMTUs(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")
	eth := func(mtu int) link.Interface { return link.Interface{Index: 2, Name: "eth0", MTU: mtu} }
	both := fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(1500), v6: eth(1500)}, defaultRoute: 9000}
	dataplanes := []struct {
		name string
		enc  v1alpha1.Encryption
		mode string
	}{
		{"direct", v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, v1alpha1.OverlayNever},
		{"VXLAN cross-subnet", v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, v1alpha1.OverlayCrossSubnet},
		{"VXLAN always", v1alpha1.Encryption{Mode: v1alpha1.EncryptionNone}, v1alpha1.OverlayAlways},
		{"WireGuard strict", v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard}, v1alpha1.OverlayCrossSubnet},
		{"WireGuard permissive, direct", v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard, Permissive: true}, v1alpha1.OverlayNever},
		{"WireGuard permissive, VXLAN", v1alpha1.Encryption{Mode: v1alpha1.EncryptionWireGuard, Permissive: true}, v1alpha1.OverlayCrossSubnet},
	}
	for _, tc := range []struct {
		name     string
		underlay fakeUnderlay
		ips      []netip.Addr
		wantU    int
		wantPod  [6]int // by dataplane, in the order above
	}{
		{"IPv4", both, []netip.Addr{v4}, 1500, [6]int{1500, 1450, 1450, 1440, 1440, 1440}},
		{"IPv6", both, []netip.Addr{v6}, 1500, [6]int{1500, 1430, 1430, 1420, 1420, 1420}},
		// WireGuard's outer packets are IPv4; VXLAN may carry IPv6.
		{"dual stack, IPv4 first", both, []netip.Addr{v4, v6}, 1500, [6]int{1500, 1430, 1430, 1440, 1440, 1430}},
		{"dual stack, IPv6 first", both, []netip.Addr{v6, v4}, 1500, [6]int{1500, 1430, 1430, 1420, 1420, 1420}},
		{"the smaller of two interfaces", fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(9000), v6: eth(1500)}}, []netip.Addr{v4, v6},
			1500, [6]int{1500, 1430, 1430, 1440, 1440, 1430}},
		{"jumbo frames", fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(9000)}}, []netip.Addr{v4}, 9000, [6]int{9000, 8950, 8950, 8940, 8940, 8940}},
		{"no interface holds the address yet: the default route's", fakeUnderlay{defaultRoute: 1400}, []netip.Addr{v6}, 1400, [6]int{1400, 1330, 1330, 1320, 1320, 1320}},
		{"no InternalIP yet: the default route's, IPv4 overheads", fakeUnderlay{defaultRoute: 1400}, nil, 1400, [6]int{1400, 1350, 1350, 1340, 1340, 1340}},
	} {
		for i, dp := range dataplanes {
			for _, explicit := range []int32{0, 1300} {
				t.Run(fmt.Sprintf("%s/%s/--mtu=%d", tc.name, dp.name, explicit), func(t *testing.T) {
					s := SettingsOf(v1alpha1.Node{Overlay: v1alpha1.Overlay{Mode: dp.mode}, Encryption: dp.enc, MTU: explicit})
					self := Node{Name: "self", IPs: tc.ips}
					u, err := UnderlayMTU(tc.underlay, self)
					want := tc.wantPod[i]
					if explicit > 0 {
						want = int(explicit)
					}
					if pod := s.PodMTU(u, self); err != nil || u != tc.wantU || pod != want {
						t.Errorf("underlay %d, pods %d, %v; want %d and %d", u, pod, err, tc.wantU, want)
					}
				})
			}
		}
	}
	if _, err := UnderlayMTU(fakeUnderlay{err: errors.New("netlink: busy")}, Node{IPs: []netip.Addr{v4}}); err == nil {
		t.Errorf("a failed look-up of the underlay: no error")
	}
}
