package wireguard

import (
	"fmt"
	"os"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// UserspaceDevice is wireguard-go running in this process on a TUN device.
// It is configured through wireguard-go's own configuration protocol,
// in-process: no control socket is made, so nodes that share a machine
// (tests, the lab) cannot reach each other's devices through the
// filesystem. The keys of its handshakes end with the process; the TUN
// device does not (it is persistent): its addresses and the routes into it
// stay, so that until the next agent opens it again, pod packets to other
// nodes go into a device that drops them, never by another path, and the
// next agent (one taking the node over, internal/handover) starts sending
// within a handshake.
//
// The TUN device and the UDP sockets belong to the network namespace of
// the thread that opens the device, and of the one that configures a new
// listen port: in the node role that is the process's; a test that runs
// several nodes in one process opens and configures each from inside its
// namespace.
type UserspaceDevice struct {
	name string
	tun  tun.Device
	dev  *device.Device
}

// OpenUserspace makes the persistent TUN device name with mtu, up, or
// opens it when it is left from the last agent, and starts wireguard-go on
// it, listening on UDP port.
func OpenUserspace(name string, mtu, port int, log logr.Logger) (*UserspaceDevice, error) {
	t, err := tun.CreateTUN(name, mtu)
	if err != nil {
		return nil, fmt.Errorf("create TUN device %s for WireGuard: %w", name, err)
	}
	if err := persist(t.File()); err != nil {
		t.Close()
		return nil, fmt.Errorf("make TUN device %s persistent: %w", name, err)
	}
	u, err := newUserspace(name, t, conn.NewDefaultBind(), port, log)
	if err != nil {
		return nil, err
	}
	link, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return u, nil
}

// OpenUserspaceFrom starts wireguard-go, listening on UDP port, on the TUN
// device whose file the running agent handed over (internal/handover):
// what was routed into the device meanwhile waits there to be read.
func OpenUserspaceFrom(f *os.File, mtu, port int, log logr.Logger) (*UserspaceDevice, error) {
	t, err := tun.CreateTUNFromFile(f, mtu)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("TUN device handed over for WireGuard: %w", err)
	}
	name, err := t.Name()
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("TUN device handed over for WireGuard: %w", err)
	}
	return newUserspace(name, t, conn.NewDefaultBind(), port, log)
}

// persist keeps the TUN device of f when its last file closes. Through the
// raw connection: Fd would put the file in blocking mode under
// wireguard-go's reads.
func persist(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) { ierr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, 1) }); err != nil {
		return err
	}
	return ierr
}

// newUserspace runs wireguard-go on t, sending through bind.
func newUserspace(name string, t tun.Device, bind conn.Bind, port int, log logr.Logger) (*UserspaceDevice, error) {
	l := log.WithValues("device", name)
	logger := &device.Logger{
		Verbosef: func(format string, args ...any) { l.V(4).Info(fmt.Sprintf(format, args...)) },
		Errorf:   func(format string, args ...any) { l.Info(fmt.Sprintf(format, args...)) },
	}
	d := device.NewDevice(t, bind, logger)
	u := &UserspaceDevice{name: name, tun: t, dev: d}
	// Up here, not on the TUN's "up" event, so that the sockets are opened
	// by this thread, in its namespace, on their port at once.
	if err := d.IpcSet(fmt.Sprintf("listen_port=%d\n", port)); err != nil {
		u.Close()
		return nil, fmt.Errorf("WireGuard on %s: listen on UDP port %d: %w", name, port, err)
	}
	if err := d.Up(); err != nil {
		u.Close()
		return nil, fmt.Errorf("start WireGuard on %s: %w", name, err)
	}
	return u, nil
}

// Configure applies cfg through the configuration protocol.
func (u *UserspaceDevice) Configure(cfg wgtypes.Config) error {
	if err := u.dev.IpcSet(encodeUAPI(cfg)); err != nil {
		return fmt.Errorf("configure WireGuard device %s: %w", u.name, err)
	}
	return nil
}

// Device reads the device back.
func (u *UserspaceDevice) Device() (*wgtypes.Device, error) {
	text, err := u.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("read WireGuard device %s: %w", u.name, err)
	}
	return decodeUAPI(u.name, text)
}

// Close stops wireguard-go; the TUN device stays, dropping what is routed
// into it, until the next agent opens it or encryption is turned off.
func (u *UserspaceDevice) Close() error {
	u.dev.Close() // closes the TUN device too
	return nil
}

// Hand stops wireguard-go and returns a file of the TUN device that stays
// open: the device queues what is routed into it (up to its transmit
// queue) instead of dropping it, until the file's new owner reads it.
func (u *UserspaceDevice) Hand() (*os.File, error) {
	rc, err := u.tun.File().SyscallConn()
	if err != nil {
		u.Close()
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		derr = err
	}
	u.Close()
	if derr != nil {
		return nil, fmt.Errorf("keep TUN device %s open: %w", u.name, derr)
	}
	return os.NewFile(uintptr(fd), u.name), nil
}
