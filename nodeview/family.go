package nodeview

import "net/netip"

// Family is an address family: IPv4 or IPv6. The zero Family is none
// (or either, where a rule reads no address).
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Families are both, in the order features make their objects.
var Families = []Family{IPv4, IPv6}

// FamilyOf is the family of a (an IPv4-mapped IPv6 address is IPv4).
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return "-"
}

// Of are the addresses of as of family f, in order.
func (f Family) Of(as []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if FamilyOf(a) == f {
			out = append(out, a)
		}
	}
	return out
}

// Prefixes are the prefixes of ps of family f, in order, masked.
func (f Family) Prefixes(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p.Masked())
		}
	}
	return out
}
