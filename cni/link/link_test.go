package link

import (
	"net"
	"net/netip"
	"testing"
)

func TestIPNetAndPrefixKeepHostBits(t *testing.T) {
	for _, s := range []string{"10.244.1.1/24", "fd00:10:244:1::1/64", "0.0.0.0/0"} {
		p := netip.MustParsePrefix(s)
		back, ok := Prefix(IPNet(p))
		if !ok || back != p {
			t.Errorf("%s came back as %s", s, back)
		}
	}
	// The kernel hands IPv4 back as 16-byte slices.
	if p, _ := Prefix(&net.IPNet{IP: net.ParseIP("10.0.0.1"), Mask: net.CIDRMask(8, 32)}); p.String() != "10.0.0.1/8" {
		t.Errorf("got %s", p)
	}
}

func TestIsDefault(t *testing.T) {
	_, zero, _ := net.ParseCIDR("0.0.0.0/0")
	_, other, _ := net.ParseCIDR("10.0.0.0/8")
	if !isDefault(nil) || !isDefault(zero) || isDefault(other) {
		t.Fatal("isDefault is wrong")
	}
}
