// Package link holds the netlink pieces the CNI plugin and the node role's
// features share: the node bridge with its gateway addresses, the interface
// that carries an address, the MTU of the node's uplink, per-namespace
// sysctls, and retries of interrupted dumps. Every function is idempotent,
// so each side may call it on every run.
package link

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"golang.org/x/sys/unix"
)

// dumpRetries bounds retries of netlink dumps that the kernel interrupted
// (ErrDumpInterrupted); a busy node changes links and addresses all the time.
const dumpRetries = 5

// Open is a route netlink handle of the calling thread's network
// namespace, for a feature's life.
func Open() (*netlink.Handle, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return h, nil
}

// Retry runs a netlink dump again while the kernel reports it interrupted.
func Retry[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpRetries {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// EnsureBridge makes the bridge exist and be up, with one gateway address
// per pod CIDR (gateway/prefix). A missing bridge is created with the given
// MTU (0: kernel default). An interface of that name that is not a bridge is
// an error, not something to delete.
func EnsureBridge(h *netlink.Handle, name string, mtu int, gateways []netip.Prefix) (*netlink.Bridge, error) {
	br, err := bridge(h, name, mtu)
	if err != nil {
		return nil, err
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(br); err != nil {
			return nil, fmt.Errorf("set bridge %s up: %w", name, err)
		}
	}
	if err := EnsureAddrs(h, br, gateways); err != nil {
		return nil, err
	}
	return br, nil
}

// EnsureAddrs puts each of addrs (with its prefix length) on l unless it is
// there. Listing first keeps the common case (the addresses are there) off
// the kernel's rtnl lock, which an address add takes even when it then
// fails with EEXIST, and which every pod being created or deleted on the
// node holds in turn. The list is per family, filtered to l: the node's
// IPv4 addresses are a few (pods' addresses live in their own namespaces);
// its IPv6 ones include one link-local address per pod veth.
func EnsureAddrs(h *netlink.Handle, l netlink.Link, addrs []netip.Prefix) error {
	for _, a := range addrs {
		if err := ensureAddr(h, l, a); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, l.Attrs().Name, err)
		}
	}
	return nil
}

// ensureAddr puts addr (with its prefix length) on l unless it is there.
func ensureAddr(h *netlink.Handle, l netlink.Link, addr netip.Prefix) error {
	fam := netlink.FAMILY_V4
	if addr.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	have, err := Retry(func() ([]netlink.Addr, error) { return h.AddrList(l, fam) })
	if err != nil {
		return err
	}
	for _, a := range have {
		if p, ok := netipx.FromStdIPNet(a.IPNet); ok && p == addr {
			return nil
		}
	}
	a := &netlink.Addr{IPNet: netipx.PrefixIPNet(addr)}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // usable at once: ADD must never wait
	}
	if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

func bridge(h *netlink.Handle, name string, mtu int) (*netlink.Bridge, error) {
	l, err := h.LinkByName(name)
	if err == nil {
		br, ok := l.(*netlink.Bridge)
		if !ok {
			return nil, fmt.Errorf("interface %s exists but is a %s, not a bridge: rename it or choose another bridge name", name, l.Type())
		}
		return br, nil
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		return nil, fmt.Errorf("look up bridge %s: %w", name, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	attrs.MTU = mtu
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create bridge %s: %w", name, err)
	}
	l, err = h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("look up bridge %s: %w", name, err)
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("interface %s exists but is a %s, not a bridge", name, l.Type())
	}
	// Pin the bridge's MAC to its current value. Otherwise the kernel gives
	// the bridge the lowest MAC of its ports, and every pod start or stop
	// may change the gateway's MAC under all pods' neighbour caches.
	if err := h.LinkSetHardwareAddr(br, br.Attrs().HardwareAddr); err != nil {
		return nil, fmt.Errorf("pin MAC of bridge %s: %w", name, err)
	}
	return br, nil
}

// DefaultRouteMTU is the MTU of the interface of the node's IPv4 (else IPv6)
// default route; 1500 when there is none.
func DefaultRouteMTU(h *netlink.Handle) int {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := Retry(func() ([]netlink.Route, error) { return h.RouteList(nil, fam) })
		if err != nil {
			continue
		}
		for _, r := range routes {
			if r.LinkIndex == 0 || !IsDefault(r.Dst) {
				continue
			}
			if l, err := h.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU > 0 {
				return l.Attrs().MTU
			}
		}
	}
	return 1500
}

// Sysctl writes a /proc/sys value (key as a path: net/ipv4/ip_forward, so
// that interface names with dots work) in the calling thread's network
// namespace; writing the value it already has is a no-op.
func Sysctl(key, value string) error { return SysctlIn("/proc/sys", key, value) }

// SysctlIn is Sysctl under another mount of /proc/sys: a node agent in an
// unprivileged pod sees its own /proc/sys read-only and writes the host's
// network sysctls through a hostPath mount of /proc/sys/net instead.
func SysctlIn(dir, key, value string) error {
	path := filepath.Join(dir, key)
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("sysctl %s does not exist on this kernel: %w", key, err)
		}
		return fmt.Errorf("set sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// IsDefault reports whether a route destination is a default route's: none
// (as the kernel reports it) or a /0.
func IsDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// Interface is a network interface as netlink lists it.
type Interface struct {
	Index int
	Name  string
	MTU   int
}

// Addrs is what InterfaceOf reads: a *netlink.Handle, or a fake of a
// feature's.
type Addrs interface {
	AddrList(l netlink.Link, family int) ([]netlink.Addr, error)
	LinkByIndex(index int) (netlink.Link, error)
}

// InterfaceOf is the interface that has the address ip; false when none has.
func InterfaceOf(h Addrs, ip netip.Addr) (Interface, bool, error) {
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := Retry(func() ([]netlink.Addr, error) { return h.AddrList(nil, fam) })
	if err != nil {
		return Interface{}, false, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := netipx.FromStdIPNet(a.IPNet); !ok || p.Addr() != ip {
			continue
		}
		l, err := h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return Interface{}, false, fmt.Errorf("interface of %s: %w", ip, err)
		}
		return Interface{Index: l.Attrs().Index, Name: l.Attrs().Name, MTU: l.Attrs().MTU}, true, nil
	}
	return Interface{}, false, nil
}
