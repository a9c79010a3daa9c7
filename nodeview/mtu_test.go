package nodeview

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/netplane/netplane/link"
)

// fakeUnderlay is the kernel as LocalPodMTU reads it: the interfaces by
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

func TestLocalPodMTUReadsTheUnderlayOfTheNodesAddresses(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")
	eth := func(mtu int) link.Interface { return link.Interface{Index: 2, Name: "eth0", MTU: mtu} }
	for _, tc := range []struct {
		name      string
		underlay  fakeUnderlay
		explicit  int
		tunnelled bool
		ips       []netip.Addr
		want      int
		wantErr   bool
	}{
		{"the InternalIP's interface less VXLAN over IPv4", fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(9000)}}, 0, true, []netip.Addr{v4}, 8950, false},
		{"not tunnelled: the interface's own", fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(9000)}}, 0, false, []netip.Addr{v4}, 9000, false},
		{"dual-stack: the smaller MTU, less the IPv6 overhead",
			fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth(9000), v6: {Index: 3, Name: "eth1", MTU: 1500}}}, 0, true, []netip.Addr{v4, v6}, 1430, false},
		{"no interface holds the address yet: the default route's", fakeUnderlay{defaultRoute: 1400}, 0, true, []netip.Addr{v4}, 1350, false},
		{"an explicit MTU wins without reading the kernel", fakeUnderlay{err: errors.New("must not be read")}, 1300, true, []netip.Addr{v4}, 1300, false},
		{"a failed look-up is an error", fakeUnderlay{err: errors.New("netlink: busy")}, 0, true, []netip.Addr{v4}, 0, true},
	} {
		got, err := LocalPodMTU(tc.underlay, tc.explicit, tc.tunnelled, Node{Name: "self", IPs: tc.ips})
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%s: LocalPodMTU = %d, %v; want %d, error %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestLocalWireGuardMTUIsTheUnderlaysLessTheTunnelsOuterFamily(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")
	eth := link.Interface{Index: 2, Name: "eth0", MTU: 1500}
	u := fakeUnderlay{addrs: map[netip.Addr]link.Interface{v4: eth, v6: eth}, defaultRoute: 9000}
	for _, tc := range []struct {
		name string
		ips  []netip.Addr
		want int
	}{
		{"IPv4 first: 60 bytes", []netip.Addr{v4, v6}, 1440},
		{"IPv6 first: 80 bytes", []netip.Addr{v6, v4}, 1420},
		{"no InternalIP yet: the default route's, less IPv4's", nil, 8940},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LocalWireGuardMTU(u, Node{Name: "self", IPs: tc.ips})
			if err != nil || got != tc.want {
				t.Errorf("LocalWireGuardMTU = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
