package podnet

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/e2e/netns"
)

// kernelStep is one call through the kernel seam: a bridge to ensure, or
// a sysctl to write when key is set.
type kernelStep struct {
	bridge   string
	mtu      int
	gateways []string
	key      string
	value    string
}

func (s kernelStep) apply(k kernel) error {
	if s.key != "" {
		return k.Sysctl(s.key, s.value)
	}
	var gws []netip.Prefix
	for _, g := range s.gateways {
		gws = append(gws, netip.MustParsePrefix(g))
	}
	return k.EnsureBridge(s.bridge, s.mtu, gws)
}

func (s kernelStep) String() string {
	if s.key != "" {
		return fmt.Sprintf("sysctl %s=%s", s.key, s.value)
	}
	return fmt.Sprintf("bridge %s mtu %d %v", s.bridge, s.mtu, s.gateways)
}

// TestFakeKernelAgreesWithTheKernel holds the fake kernel to the kernel:
// each case runs its steps on the kernel, in a network namespace of its
// own, and on a fake set up alike; both must refuse the same steps (a
// missing sysctl as fs.ErrNotExist on both) and leave the same bridge
// (kind, up, MTU, addresses) and the same values of the sysctls written.
func TestFakeKernelAgreesWithTheKernel(t *testing.T) {
	br := func(name string, mtu int, gws ...string) kernelStep {
		return kernelStep{bridge: name, mtu: mtu, gateways: gws}
	}
	sysctl := func(key, value string) kernelStep { return kernelStep{key: key, value: value} }
	for _, tc := range []struct {
		name        string
		veth        string // an interface of this name that is a veth, made first
		disableIPv6 bool   // net.ipv6.conf.default.disable_ipv6=1 first
		steps       []kernelStep
	}{
		{name: "a bridge with both gateways and its sysctls", steps: []kernelStep{
			br("npbr0", 1450, "10.244.0.1/24", "fd00:10:244::1/64"),
			sysctl("net/ipv4/conf/npbr0/route_localnet", "1"), sysctl("net/ipv4/ip_forward", "1"), sysctl("net/ipv6/conf/all/forwarding", "1")}},
		{name: "the same bridge twice", steps: []kernelStep{br("npbr0", 1450, "10.244.0.1/24"), br("npbr0", 1450, "10.244.0.1/24")}},
		{name: "an existing bridge keeps its MTU", steps: []kernelStep{br("npbr0", 1500), br("npbr0", 1450, "10.244.0.1/24")}},
		{name: "the default MTU", steps: []kernelStep{br("npbr0", 0)}},
		{name: "a name too long", steps: []kernelStep{br("netplane-bridge0", 1450)}},
		{name: "a name with a slash", steps: []kernelStep{br("np/br", 1450)}},
		{name: "an MTU above a bridge's", steps: []kernelStep{br("npbr0", 65536)}},
		{name: "the largest MTU", steps: []kernelStep{br("npbr0", 65535)}},
		{name: "an MTU below a bridge's", steps: []kernelStep{br("npbr0", 67)}},
		{name: "the name held by a veth", veth: "npbr0", steps: []kernelStep{br("npbr0", 1450, "10.244.0.1/24")}},
		{name: "IPv6 disabled", disableIPv6: true, steps: []kernelStep{br("npbr0", 1450, "10.244.0.1/24", "fd00:10:244::1/64")}},
		{name: "an IPv6 address held with another prefix length", steps: []kernelStep{br("npbr0", 1450, "fd00::1/64"), br("npbr0", 1450, "fd00::1/80")}},
		{name: "an IPv4 address held with another prefix length", steps: []kernelStep{br("npbr0", 1450, "10.0.0.1/24"), br("npbr0", 1450, "10.0.0.1/25")}},
		{name: "a sysctl of an interface not there yet", steps: []kernelStep{sysctl("net/ipv4/conf/npbr0/route_localnet", "1")}},
		{name: "a value that is not a number", steps: []kernelStep{sysctl("net/ipv4/ip_forward", "yes")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "podnet-kernel")
			fake := newFakeKernel()
			if tc.veth != "" {
				ns.MustExec(t, "ip", "link", "add", tc.veth, "type", "veth", "peer", "name", "npveth-peer")
				fake.addLink(tc.veth, "veth", 1500).up = false // as ip link add leaves it
			}
			if tc.disableIPv6 {
				ns.Sysctl(t, "net.ipv6.conf.default.disable_ipv6", "1")
				fake.sysctls["net/ipv6/conf/default/disable_ipv6"] = "1"
			}
			real := newHostKernel(ns.Netlink(t), "/proc/sys")
			written := map[string]bool{}
			for _, s := range tc.steps {
				// Sysctl files answer for the namespace of the thread
				// that opens them: every call runs inside ns.
				var realErr error
				if err := ns.Do(func() error { realErr = s.apply(real); return nil }); err != nil {
					t.Fatal(err)
				}
				fakeErr := s.apply(fake)
				if (realErr == nil) != (fakeErr == nil) || errors.Is(realErr, fs.ErrNotExist) != errors.Is(fakeErr, fs.ErrNotExist) {
					t.Errorf("%s: the kernel says %v, the fake %v", s, realErr, fakeErr)
				}
				if s.key != "" {
					written[s.key] = true
				}
			}
			bridge := "npbr0"
			if got, want := fakeView(fake, bridge, written), kernelView(t, ns, bridge, written); got != want {
				t.Errorf("the fake holds\n%s\nthe kernel\n%s", got, want)
			}
		})
	}
}

// kernelView describes interface name (kind, up, MTU, addresses but
// link-local ones) and the sysctls in keys as the kernel in ns has them.
func kernelView(t *testing.T, ns *netns.NS, name string, keys map[string]bool) string {
	t.Helper()
	h := ns.Netlink(t)
	desc := "none"
	if l, err := h.LinkByName(name); err == nil {
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		var ps []netip.Prefix
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			if !ip.IsLinkLocalUnicast() {
				ps = append(ps, netip.PrefixFrom(ip.Unmap(), ones))
			}
		}
		desc = describeLink(l.Type(), l.Attrs().Flags&net.FlagUp != 0, l.Attrs().MTU, ps)
	}
	values := map[string]string{}
	if err := ns.Do(func() error {
		for key := range keys {
			b, err := os.ReadFile(filepath.Join("/proc/sys", key))
			values[key] = strings.TrimSpace(string(b))
			if err != nil {
				values[key] = "missing"
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return desc + describeSysctls(values)
}

// fakeView is kernelView of the fake.
func fakeView(k *fakeKernel, name string, keys map[string]bool) string {
	desc := "none"
	if l, ok := k.links[name]; ok {
		desc = describeLink(l.kind, l.up, l.mtu, l.addrs)
	}
	values := map[string]string{}
	for key := range keys {
		v, ok := k.sysctls[key]
		if !ok {
			v = "missing"
		}
		values[key] = v
	}
	return desc + describeSysctls(values)
}

func describeLink(kind string, up bool, mtu int, addrs []netip.Prefix) string {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return fmt.Sprintf("%s up=%v mtu %d %v", kind, up, mtu, addrs)
}

func describeSysctls(values map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(values)) {
		out = append(out, k+"="+values[k])
	}
	return " " + strings.Join(out, " ")
}
