package link

import (
	"net"
	"net/netip"
	"testing"

	"go4.org/netipx"
)

// ensureAddr compares the bridge's addresses, as the kernel lists them, with
// gateway prefixes that keep their host bits (10.244.1.1/24): the
// conversions must keep host bits both ways, and read the 16-byte form the
// kernel may use for IPv4 as IPv4.
func TestPrefixConversionsKeepHostBits(t *testing.T) {
	for _, s := range []string{"10.244.1.1/24", "fd00:10:244:1::1/64", "0.0.0.0/0"} {
		p := netip.MustParsePrefix(s)
		back, ok := netipx.FromStdIPNet(netipx.PrefixIPNet(p))
		if !ok || back != p {
			t.Errorf("%s came back as %s", s, back)
		}
	}
	if p, _ := netipx.FromStdIPNet(&net.IPNet{IP: net.ParseIP("10.0.0.1"), Mask: net.CIDRMask(8, 32)}); p.String() != "10.0.0.1/8" {
		t.Errorf("16-byte IPv4 10.0.0.1/8 came back as %s", p)
	}
}

func TestIsDefault(t *testing.T) {
	for _, tc := range []struct {
		dst  string
		want bool
	}{{"", true}, {"0.0.0.0/0", true}, {"::/0", true}, {"10.0.0.0/8", false}, {"fd00::/8", false}} {
		var dst *net.IPNet
		if tc.dst != "" {
			_, dst, _ = net.ParseCIDR(tc.dst)
		}
		if got := IsDefault(dst); got != tc.want {
			t.Errorf("IsDefault(%q) = %v, want %v", tc.dst, got, tc.want)
		}
	}
}
