package overlay

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestMACIsStableLocallyAdministeredUnicastAndDistinct(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"192.168.20.13", "0e:6e:c0:a8:14:0d"},
		{"10.0.0.1", "0e:6e:0a:00:00:01"},
		{"::ffff:10.0.0.1", "0e:6e:0a:00:00:01"},
	} {
		if got := MAC(netip.MustParseAddr(tc.ip)).String(); got != tc.want {
			t.Errorf("MAC(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
	seen := map[string]string{}
	for i := range 2000 {
		ip := netip.MustParseAddr(fmt.Sprintf("fd00:b::%x", i))
		m := MAC(ip)
		if m[0]&0x02 == 0 || m[0]&0x01 != 0 {
			t.Fatalf("MAC(%s) = %s: not a locally administered unicast MAC", ip, m)
		}
		if other, dup := seen[m.String()]; dup {
			t.Fatalf("MAC(%s) = MAC(%s) = %s", ip, other, m)
		}
		seen[m.String()] = ip.String()
		if again := MAC(ip); again.String() != m.String() {
			t.Fatalf("MAC(%s) changed from %s to %s", ip, m, again)
		}
	}
}

func TestGatewayIsTheInternalIPOrTheLinkLocalAddressOfTheTunnelMAC(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"192.168.20.13", "192.168.20.13"},
		{"fd00:a::11", "fe80::102d:92ff:fe6a:cf94"}, // MAC 12:2d:92:6a:cf:94
	} {
		if got := Gateway(netip.MustParseAddr(tc.ip)).String(); got != tc.want {
			t.Errorf("Gateway(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	if d := (Config{}).Defaults(); d != (Config{Mode: CrossSubnet, Port: 4789, VNI: 1}) || d.Validate() != nil {
		t.Errorf("defaults %+v (valid: %v), want cross-subnet 4789 1", d, d.Validate())
	}
	for _, bad := range []Config{{Mode: "vxlan", Port: 1, VNI: 1}, {Mode: Always, Port: 70000, VNI: 1}, {Mode: Always, Port: 1, VNI: 1 << 24}} {
		if bad.Validate() == nil {
			t.Errorf("%+v is accepted", bad)
		}
	}
}

func TestConnectedPrefixesAreGatewaylessUnicastRoutesOfOtherOwners(t *testing.T) {
	dst := func(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }
	routes := []netlink.Route{
		{Dst: dst("192.168.10.0/24"), LinkIndex: 2, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_KERNEL},      // an address's prefix
		{Dst: dst("10.1.0.0/16"), LinkIndex: 2, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_STATIC},          // on-link, by hand
		{Dst: dst("fd00:a::/64"), LinkIndex: 2, Type: unix.RTN_UNICAST, Protocol: unix.RTPROT_RA},              // on-link, from RAs
		{Dst: dst("0.0.0.0/0"), LinkIndex: 3, Type: unix.RTN_UNICAST},                                          // point-to-point default
		{Dst: nil, LinkIndex: 3, Type: unix.RTN_UNICAST},                                                       // default, as netlink may give it
		{Dst: dst("192.168.30.0/24"), LinkIndex: 2, Gw: net.ParseIP("192.168.10.254"), Type: unix.RTN_UNICAST}, // behind a router
		{Dst: dst("10.244.2.0/24"), LinkIndex: 2, Gw: net.ParseIP("192.168.10.12"), Protocol: RouteProtocol},   // ours
		{Dst: dst("10.244.1.0/24"), LinkIndex: 4, Type: unix.RTN_UNICAST, Protocol: RouteProtocol},             // ours, gatewayless
		{Dst: dst("10.244.3.0/24"), LinkIndex: 9, Type: unix.RTN_UNICAST},                                      // through a tunnel device
		{Dst: dst("10.9.0.0/16"), LinkIndex: 0, Type: unix.RTN_BLACKHOLE},                                      // blackhole
		{Dst: dst("10.8.0.0/16"), LinkIndex: 2, Type: unix.RTN_UNICAST, MultiPath: []*netlink.NexthopInfo{{}}}, // multipath
	}
	got := fmt.Sprint(ConnectedPrefixes(routes, map[int]bool{9: true}))
	if want := "[10.1.0.0/16 192.168.10.0/24 fd00:a::/64]"; got != want {
		t.Errorf("connected: %s, want %s", got, want)
	}
}
