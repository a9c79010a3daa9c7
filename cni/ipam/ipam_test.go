package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func TestUsableExcludesNetworkGatewayAndBroadcast(t *testing.T) {
	for _, tc := range []struct{ r, first, last, gw string }{
		{"10.244.1.0/24", "10.244.1.2", "10.244.1.254", "10.244.1.1"},
		{"10.0.0.0/30", "10.0.0.2", "10.0.0.2", "10.0.0.1"},
		{"10.0.0.8/29", "10.0.0.10", "10.0.0.14", "10.0.0.9"},
		{"fd00:10:244:1::/64", "fd00:10:244:1::2", "fd00:10:244:1:ffff:ffff:ffff:ffff", "fd00:10:244:1::1"},
		{"fd00::/126", "fd00::2", "fd00::3", "fd00::1"},
	} {
		first, last := Usable(pfx(tc.r))
		if first != addr(tc.first) || last != addr(tc.last) || Gateway(pfx(tc.r)) != addr(tc.gw) {
			t.Errorf("%s: got first=%s last=%s gw=%s, want %s %s %s", tc.r, first, last, Gateway(pfx(tc.r)), tc.first, tc.last, tc.gw)
		}
	}
}

func TestValidateRange(t *testing.T) {
	for _, tc := range []struct {
		r, err string
	}{
		{"10.244.0.0/24", ""},
		{"10.244.0.0/30", ""},
		{"10.244.0.0/31", "too small"},
		{"10.244.0.1/24", "host bits"},
		{"fd00::/126", ""},
		{"fd00::/127", "too small"},
		{"::ffff:10.0.0.0/120", "IPv4-mapped"},
	} {
		err := ValidateRange(pfx(tc.r))
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %v, want error containing %q", tc.r, err, tc.err)
		}
	}
}

func alloc(t *testing.T, s *State, ranges []netip.Prefix, cid string, want ...netip.Addr) []string {
	t.Helper()
	a, err := s.Allocate(ranges, Request{ContainerID: cid, IfName: "eth0", Requested: want}, "", nil)
	if err != nil {
		t.Fatalf("allocate %s: %v", cid, err)
	}
	var out []string
	for _, p := range a.IPs {
		out = append(out, p.String())
	}
	return out
}

func TestAllocateIsRoundRobinAndDoesNotReuseAReleasedAddressAtOnce(t *testing.T) {
	s := &State{}
	r := []netip.Prefix{pfx("10.0.0.0/29")} // pods get .2 to .6
	for i, want := range []string{"10.0.0.2/29", "10.0.0.3/29", "10.0.0.4/29"} {
		if got := alloc(t, s, r, fmt.Sprint("c", i)); got[0] != want {
			t.Fatalf("allocation %d: got %v, want %s", i, got, want)
		}
	}
	s.Release("c0", "eth0")
	for i, want := range []string{"10.0.0.5/29", "10.0.0.6/29", "10.0.0.2/29"} {
		if got := alloc(t, s, r, fmt.Sprint("d", i)); got[0] != want {
			t.Fatalf("allocation after release %d: got %v, want %s (round robin wraps)", i, got, want)
		}
	}
	_, err := s.Allocate(r, Request{ContainerID: "x", IfName: "eth0"}, "", nil)
	var ex *ErrExhausted
	if !errors.As(err, &ex) || ex.Range != r[0] || !strings.Contains(err.Error(), "10.0.0.0/29 is full") {
		t.Fatalf("full range: got %v, want an ErrExhausted naming 10.0.0.0/29", err)
	}
	if len(s.Attachments) != 6-1 {
		t.Fatalf("failed allocation changed the table: %d attachments", len(s.Attachments))
	}
}

func TestAllocateDualStackTakesOneAddressPerRange(t *testing.T) {
	s := &State{}
	r := []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}
	got := alloc(t, s, r, "a")
	if len(got) != 2 || got[0] != "10.244.1.2/24" || got[1] != "fd00:10:244:1::2/64" {
		t.Fatalf("got %v", got)
	}
}

func TestAllocateHonoursRequestedAddresses(t *testing.T) {
	r := []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00::/64")}
	s := &State{}
	got := alloc(t, s, r, "a", addr("10.244.1.77"))
	if got[0] != "10.244.1.77/24" || got[1] != "fd00::2/64" {
		t.Fatalf("got %v", got)
	}
	// The requested address does not move the cursor.
	if got := alloc(t, s, r, "b"); got[0] != "10.244.1.2/24" {
		t.Fatalf("next after a requested address: got %v", got)
	}
	for _, tc := range []struct {
		want netip.Addr
		err  string
	}{
		{addr("10.244.1.77"), "already in use"},
		{addr("10.244.1.1"), "reserved"},
		{addr("10.244.1.255"), "reserved"},
		{addr("10.9.9.9"), "outside"},
	} {
		_, err := s.Allocate(r, Request{ContainerID: "x", IfName: "eth0", Requested: []netip.Addr{tc.want}}, "", nil)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("request %s: got %v, want error containing %q", tc.want, err, tc.err)
		}
	}
}

func TestAllocateRejectsASecondAllocationForTheSameAttachment(t *testing.T) {
	s := &State{}
	r := []netip.Prefix{pfx("10.244.1.0/24")}
	alloc(t, s, r, "a")
	if _, err := s.Allocate(r, Request{ContainerID: "a", IfName: "eth0"}, "", nil); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("got %v, want ErrDuplicate", err)
	}
	// The same container with another interface gets its own address.
	a, err := s.Allocate(r, Request{ContainerID: "a", IfName: "net1"}, "", nil)
	if err != nil || a.IPs[0].String() != "10.244.1.3/24" {
		t.Fatalf("second interface: %v %v", a, err)
	}
}

func TestAllocateInAHugeIPv6RangeIsFast(t *testing.T) {
	s := &State{}
	r := []netip.Prefix{pfx("fd00::/64")}
	for i := range 1000 {
		alloc(t, s, r, fmt.Sprint(i))
	}
	if len(s.used()) != 1000 {
		t.Fatal("addresses not unique")
	}
}

func TestReleaseOfAnUnknownAttachmentIsANoOp(t *testing.T) {
	s := &State{}
	if _, ok := s.Release("nope", "eth0"); ok {
		t.Fatal("released something unknown")
	}
}
