package podnet

import (
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/link"
)

// fakeKernel is the kernel as the pod network sees it through the kernel
// seam, refusing what the kernel refuses: an interface name it does not
// take, an MTU out of a bridge's range, a name held by an interface that
// is not a bridge, an IPv6 address on an interface with IPv6 disabled, a
// sysctl it does not have and a value that is not a number. What it
// accepts it keeps as the kernel does: an existing bridge keeps its MTU;
// an IPv6 address a bridge already holds with another prefix length is
// refused with EEXIST, which EnsureBridge takes as done, while IPv4 takes
// the same address with another prefix length as a second address.
// TestFakeKernelAgreesWithTheKernel holds it to the kernel.
type fakeKernel struct {
	links           map[string]*fakeLink
	sysctls         map[string]string
	defaultRouteMTU int
	nextIndex       int
}

type fakeLink struct {
	index int
	kind  string // bridge, veth
	mtu   int
	up    bool
	addrs []netip.Prefix
}

// newFakeKernel is a node's kernel with br_netfilter loaded, loopback and
// no other interface.
func newFakeKernel() *fakeKernel {
	k := &fakeKernel{links: map[string]*fakeLink{}, defaultRouteMTU: 1500, nextIndex: 1,
		sysctls: map[string]string{"net/ipv4/ip_forward": "0"}}
	for _, key := range bridgeNetfilter {
		k.sysctls[key] = "0"
	}
	for _, dev := range []string{"all", "default"} {
		k.interfaceSysctls(dev, "0")
	}
	k.addLink("lo", "loopback", 65536, netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128"))
	return k
}

// interfaceSysctls makes the per-interface sysctls the seam's users read
// or write, as the kernel does for a new interface (disable_ipv6 from
// default's).
func (k *fakeKernel) interfaceSysctls(dev, disableIPv6 string) {
	k.sysctls["net/ipv4/conf/"+dev+"/route_localnet"] = "0"
	k.sysctls["net/ipv6/conf/"+dev+"/forwarding"] = "0"
	k.sysctls["net/ipv6/conf/"+dev+"/disable_ipv6"] = disableIPv6
}

// addLink adds an interface as someone else made it.
func (k *fakeKernel) addLink(name, kind string, mtu int, addrs ...netip.Prefix) *fakeLink {
	l := &fakeLink{index: k.nextIndex, kind: kind, mtu: mtu, up: true, addrs: addrs}
	k.nextIndex++
	k.links[name] = l
	k.interfaceSysctls(name, k.sysctls["net/ipv6/conf/default/disable_ipv6"])
	return l
}

// validName is the kernel's dev_valid_name.
func validName(name string) bool {
	if name == "" || len(name) >= unix.IFNAMSIZ || name == "." || name == ".." {
		return false
	}
	return !strings.ContainsAny(name, "/: \t\n\v\f\r")
}

func (k *fakeKernel) EnsureBridge(name string, mtu int, gateways []netip.Prefix) error {
	br, ok := k.links[name]
	switch {
	case ok && br.kind != "bridge":
		return fmt.Errorf("interface %s exists but is a %s, not a bridge: rename it or choose another bridge name", name, br.kind)
	case !ok && !validName(name):
		return fmt.Errorf("create bridge %s: %w", name, unix.EINVAL)
	case !ok && mtu != 0 && (mtu < 68 || mtu > 65535):
		return fmt.Errorf("create bridge %s: %w", name, unix.EINVAL)
	case !ok:
		if mtu == 0 {
			mtu = 1500
		}
		br = k.addLink(name, "bridge", mtu)
		br.up = false
	}
	br.up = true
	for _, gw := range gateways {
		if err := k.addAddr(name, br, gw); err != nil {
			return fmt.Errorf("add gateway %s to bridge %s: %w", gw, name, err)
		}
	}
	return nil
}

// addAddr is an address add as EnsureBridge makes it: nothing when the
// interface holds addr, the kernel's refusals, EEXIST taken as done.
func (k *fakeKernel) addAddr(name string, l *fakeLink, addr netip.Prefix) error {
	if slices.Contains(l.addrs, addr) {
		return nil
	}
	if addr.Addr().Is6() {
		if k.sysctls["net/ipv6/conf/"+name+"/disable_ipv6"] != "0" {
			return unix.EACCES
		}
		if slices.ContainsFunc(l.addrs, func(p netip.Prefix) bool { return p.Addr() == addr.Addr() }) {
			return nil // EEXIST
		}
	}
	l.addrs = append(l.addrs, addr)
	return nil
}

func (k *fakeKernel) Sysctl(key, value string) error {
	if _, ok := k.sysctls[key]; !ok {
		return fmt.Errorf("sysctl %s does not exist on this kernel: %w", key, fs.ErrNotExist)
	}
	if _, err := strconv.Atoi(strings.TrimSpace(value)); err != nil {
		return fmt.Errorf("set sysctl %s=%s: %w", key, value, unix.EINVAL)
	}
	k.sysctls[key] = value
	return nil
}

func (k *fakeKernel) HasSysctl(key string) bool {
	_, ok := k.sysctls[key]
	return ok
}

func (k *fakeKernel) InterfaceOf(ip netip.Addr) (link.Interface, bool, error) {
	for _, name := range slices.Sorted(maps.Keys(k.links)) {
		l := k.links[name]
		if slices.ContainsFunc(l.addrs, func(p netip.Prefix) bool { return p.Addr() == ip }) {
			return link.Interface{Index: l.index, Name: name, MTU: l.mtu}, true, nil
		}
	}
	return link.Interface{}, false, nil
}

func (k *fakeKernel) DefaultRouteMTU() int { return k.defaultRouteMTU }
