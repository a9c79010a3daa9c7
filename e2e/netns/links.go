package netns

import (
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Veth connects two namespaces with a veth pair, aIf in a and bIf in b, both
// up. Each end is created directly in its namespace.
func Veth(t testing.TB, a *NS, aIf string, b *NS, bIf string) {
	t.Helper()
	a.MustExec(t, "ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b.Path)
	a.MustExec(t, "ip", "link", "set", aIf, "up")
	b.MustExec(t, "ip", "link", "set", bIf, "up")
}

// Bridge makes a bridge named name in ns, up.
func (ns *NS) Bridge(t testing.TB, name string) {
	t.Helper()
	ns.MustExec(t, "ip", "link", "add", name, "type", "bridge")
	ns.MustExec(t, "ip", "link", "set", name, "up")
}

// Attach puts interface ifname into bridge br (both in ns).
func (ns *NS) Attach(t testing.TB, ifname, br string) {
	t.Helper()
	ns.MustExec(t, "ip", "link", "set", ifname, "master", br)
}

// Addr adds a CIDR address to ifname in ns (IPv6 without duplicate address
// detection, so it is usable at once).
func (ns *NS) Addr(t testing.TB, ifname, cidr string) {
	t.Helper()
	args := []string{"addr", "add", cidr, "dev", ifname}
	if isV6(cidr) {
		args = append(args, "nodad")
	}
	ns.MustExec(t, "ip", args...)
}

// Route adds a route in ns, e.g. Route(t, "default", "via", "10.0.0.1").
func (ns *NS) Route(t testing.TB, dst string, rest ...string) {
	t.Helper()
	fam := "-4"
	if isV6(dst) || (dst == "default" && len(rest) > 1 && isV6(rest[1])) {
		fam = "-6"
	}
	ns.MustExec(t, "ip", append([]string{fam, "route", "add", dst}, rest...)...)
}

// Host makes a namespace linked to another one (the "switch" side) by a
// veth: hostIf inside the new namespace, peerIf on the other side. It is the
// usual shape of a test host or pod.
func Host(t testing.TB, label string, peer *NS, peerIf, hostIf string) *NS {
	t.Helper()
	h := New(t, label)
	Veth(t, h, hostIf, peer, peerIf)
	return h
}

func isV6(s string) bool {
	for _, c := range s {
		if c == ':' {
			return true
		}
	}
	return false
}

// String names the namespace in messages.
func (ns *NS) String() string { return fmt.Sprintf("netns %s", ns.Name) }

// NewNoDAD is New with IPv6 duplicate address detection off for every
// interface made in the namespace later, link-local addresses included:
// with it, those stay tentative for a second or two, neighbour discovery
// waits, and the first connections of a test time out for reasons that
// have nothing to do with what it tests.
func NewNoDAD(t testing.TB, label string) *NS {
	t.Helper()
	ns := New(t, label)
	ns.Sysctl(t, "net.ipv6.conf.all.accept_dad", "0")
	ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
	return ns
}

// HostNoDAD is Host made with NewNoDAD.
func HostNoDAD(t testing.TB, label string, peer *NS, peerIf, hostIf string) *NS {
	t.Helper()
	h := NewNoDAD(t, label)
	Veth(t, h, hostIf, peer, peerIf)
	return h
}

// Netlink opens a netlink handle bound to ns; it is closed with the test.
func (ns *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	if err := ns.Do(func() (err error) { h, err = netlink.NewHandle(unix.NETLINK_ROUTE); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}
