package nft

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
)

func TestInPrefixComparesTheMaskedAddressAtTheRightOffset(t *testing.T) {
	for _, tc := range []struct {
		prefix        string
		dst           bool
		offset, len   uint32
		mask, network string
	}{
		{"10.244.1.7/24", false, 12, 4, "[255 255 255 0]", "[10 244 1 0]"},
		{"10.0.0.0/8", true, 16, 4, "[255 0 0 0]", "[10 0 0 0]"},
		{"fd00:10:244::/48", true, 24, 16, "[255 255 255 255 255 255 0 0 0 0 0 0 0 0 0 0]", "[253 0 0 16 2 68 0 0 0 0 0 0 0 0 0 0]"},
		{"fd00::1/128", false, 8, 16, "[255 255 255 255 255 255 255 255 255 255 255 255 255 255 255 255]", "[253 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1]"},
	} {
		e := InPrefix(netip.MustParsePrefix(tc.prefix), tc.dst, false)
		p, b, c := e[2].(*expr.Payload), e[3].(*expr.Bitwise), e[4].(*expr.Cmp)
		if p.Offset != tc.offset || p.Len != tc.len || fmt.Sprint(b.Mask) != tc.mask || fmt.Sprint(c.Data) != tc.network {
			t.Errorf("%s dst=%v: offset %d len %d mask %v data %v", tc.prefix, tc.dst, p.Offset, p.Len, b.Mask, c.Data)
		}
	}
}

func TestInPrefixNegates(t *testing.T) {
	e := InPrefix(netip.MustParsePrefix("10.0.0.0/8"), true, true)
	if e[4].(*expr.Cmp).Op != expr.CmpOpNeq {
		t.Fatal("neq not applied")
	}
}
