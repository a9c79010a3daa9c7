package wireguard

import (
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Device is one WireGuard device: the seam between the Syncer and the
// kernel's or wireguard-go's implementation (and the Fake).
type Device interface {
	// Configure applies cfg as `wg set` would: only what it names changes.
	Configure(cfg wgtypes.Config) error
	// Device reads the device back: key, port, peers with their handshake
	// times and byte counts.
	Device() (*wgtypes.Device, error)
	// Close lets go of the device. The kernel's stays, with its peers and
	// current keys; of the userspace one only its TUN device stays.
	Close() error
}

// Implementations of WireGuard, as --wireguard-implementation names them.
const (
	Auto      = "auto"
	Kernel    = "kernel"
	Userspace = "userspace"
)

// Open opens the device name listening on UDP port in the calling
// thread's network namespace with the implementation impl, and says which
// one runs: with Auto, the kernel's when a wireguard link can be made,
// else the userspace one.
func Open(impl, name string, mtu, port int, log logr.Logger) (Device, string, error) {
	switch impl {
	case Kernel:
		d, err := OpenKernel(name, mtu, port)
		return d, Kernel, err
	case Userspace:
		d, err := OpenUserspace(name, mtu, port, log)
		return d, Userspace, err
	case Auto:
		if l, err := netlink.LinkByName(name); err == nil && l.Type() == "tuntap" {
			// Left by the last agent, which ran it in-process: this kernel
			// has no WireGuard, or it would have been the kernel's.
			u, err := OpenUserspace(name, mtu, port, log)
			return u, Userspace, err
		}
		d, err := OpenKernel(name, mtu, port)
		if err == nil {
			return d, Kernel, nil
		}
		if !errors.Is(err, errNoKernelWireGuard) {
			return nil, "", err
		}
		log.Info("the kernel has no WireGuard; running it in-process", "reason", err)
		u, err := OpenUserspace(name, mtu, port, log)
		return u, Userspace, err
	}
	return nil, "", fmt.Errorf("WireGuard implementation %q is not one of auto, kernel, userspace", impl)
}

var errNoKernelWireGuard = errors.New("the kernel cannot make a wireguard link (no wireguard module)")

// ensureKernelLink makes the wireguard link name, up, unless it exists;
// a link of that name of another kind is an error, not replaced.
func ensureKernelLink(name string, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err == nil {
		if l.Type() != "wireguard" {
			return fmt.Errorf("interface %s exists and is a %s device, not wireguard: delete it", name, l.Type())
		}
		return netlink.LinkSetUp(l)
	}
	if _, ok := err.(netlink.LinkNotFoundError); !ok {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = name, mtu
	wg := &netlink.Wireguard{LinkAttrs: attrs}
	if err := netlink.LinkAdd(wg); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("%w: %v", errNoKernelWireGuard, err)
		}
		return fmt.Errorf("add wireguard link %s: %w", name, err)
	}
	return netlink.LinkSetUp(wg)
}
