package wireguard

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

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
	tun  *gatedTUN
	bind *handoffBind
	dev  *device.Device
	log  logr.Logger
	// down: handed over by a running agent (handoff.go), it goes up on
	// its port at its first configuration with a key; relay is the way to
	// that agent until then.
	down     bool
	relay    *net.UnixConn
	released chan struct{} // handed over: closed once done serving
	closing  sync.Once
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
	u, err := newUserspace(name, t, newPortBind(), port, log)
	if err == nil {
		err = u.up()
	}
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

// OpenUserspaceFrom carries on, on UDP port, with the device the running
// agent handed over (internal/handover): its TUN device's file, where
// what was routed into the device meanwhile waits to be read, and the
// relay to that agent's wireguard-go (handoff.go). With a relay the device
// stays down, and that agent serves, until its first configuration with a
// key; without one it is up at once.
func OpenUserspaceFrom(files []*os.File, mtu, port int, log logr.Logger) (*UserspaceDevice, error) {
	var relay *net.UnixConn
	if len(files) > 1 {
		c, err := net.FileConn(files[1])
		for _, f := range files[1:] {
			f.Close()
		}
		if uc, ok := c.(*net.UnixConn); ok && err == nil {
			relay = uc
		} else if c != nil {
			c.Close()
		}
	}
	t, err := tun.CreateTUNFromFile(files[0], mtu)
	if err == nil {
		var name string
		if name, err = t.Name(); err == nil {
			u, err := newUserspace(name, t, newPortBind(), port, log)
			if err != nil || relay == nil {
				if err == nil {
					err = u.up()
				}
				return u, err
			}
			u.awaitTake(relay)
			return u, nil
		}
		t.Close()
	} else {
		files[0].Close()
	}
	if relay != nil {
		relay.Close()
	}
	return nil, fmt.Errorf("TUN device handed over for WireGuard: %w", err)
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

// newUserspace makes wireguard-go on t, down, its port set, its TUN
// device not read until it goes up.
func newUserspace(name string, t tun.Device, bind conn.Bind, port int, log logr.Logger) (*UserspaceDevice, error) {
	l := log.WithValues("device", name)
	logger := &device.Logger{
		Verbosef: func(format string, args ...any) { l.V(4).Info(fmt.Sprintf(format, args...)) },
		Errorf:   func(format string, args ...any) { l.Info(fmt.Sprintf(format, args...)) },
	}
	g, b := newGatedTUN(t, false), newHandoffBind(bind)
	u := &UserspaceDevice{name: name, tun: g, bind: b, dev: device.NewDevice(g, b, logger), log: l, released: make(chan struct{})}
	if err := u.dev.IpcSet(fmt.Sprintf("listen_port=%d\n", port)); err != nil {
		u.Close()
		return nil, fmt.Errorf("WireGuard on %s: UDP port %d: %w", name, port, err)
	}
	return u, nil
}

// up opens the sockets, here, not on the TUN's "up" event, so that they
// are opened by this thread, in its namespace, on their port at once; then
// the TUN device is read.
func (u *UserspaceDevice) up() error {
	if err := u.dev.Up(); err != nil {
		u.Close()
		return fmt.Errorf("start WireGuard on %s: %w", u.name, err)
	}
	u.tun.start()
	return nil
}

// Configure applies cfg through the configuration protocol. A device
// handed over goes up at the first that gives it a key: it takes the port
// from the running agent and makes a handshake with every peer.
func (u *UserspaceDevice) Configure(cfg wgtypes.Config) error {
	if err := u.dev.IpcSet(encodeUAPI(cfg)); err != nil {
		return fmt.Errorf("configure WireGuard device %s: %w", u.name, err)
	}
	if u.down && cfg.PrivateKey != nil {
		return u.takeOver()
	}
	return nil
}

// takeOver takes the port and the peers' traffic from the agent that
// handed the device over.
func (u *UserspaceDevice) takeOver() error {
	d, err := u.Device()
	if err != nil {
		return err
	}
	peers := make([]Peer, len(d.Peers))
	for i, p := range d.Peers {
		peers[i].PublicKey = p.PublicKey
	}
	// Up with each peer's keepalive on sends each a keepalive, and so a
	// handshake: peers switch to this device's sessions at once. Set
	// before the take, so that the sockets go unread for as little time
	// as the two processes take to say so.
	shake := Handshake(peers)
	on, off := shake[:len(peers)], shake[len(peers):]
	if err := u.dev.IpcSet(encodeUAPI(wgtypes.Config{Peers: on})); err != nil {
		return fmt.Errorf("configure WireGuard device %s: %w", u.name, err)
	}
	var took error
	var closed time.Time
	if u.relay != nil {
		closed, took = u.bind.take(u.relay)
		if took != nil {
			u.relay.Close()
		}
		u.relay = nil
	}
	if err := u.dev.Up(); err != nil {
		return fmt.Errorf("start WireGuard on %s on the port the running agent let go of: %w", u.name, err)
	}
	if took != nil {
		// Gone, or its device was closed: its port was free.
		u.log.Error(took, "the running agent's wireguard-go did not answer: up without its sessions")
	} else if !closed.IsZero() {
		u.log.Info("took the WireGuard port over; the running agent decrypts its sessions a moment longer", "unreadFor", max(0, u.bind.bound().Sub(closed)).Round(time.Microsecond))
	}
	u.down = false
	u.tun.start()
	if err := u.dev.IpcSet(encodeUAPI(wgtypes.Config{Peers: off})); err != nil {
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
	u.closing.Do(func() {
		if u.relay != nil {
			u.relay.Close()
		}
		u.dev.Close() // closes the TUN device and the relay too
	})
	return nil
}

// Hand gives the device to the next agent: a file of the TUN device that
// stays open, so that the device queues what is routed into it (up to its
// transmit queue) instead of dropping it, and the relay's other end. This
// device serves on until that agent takes its port (handoff.go), and
// decrypts its sessions relayWindow longer; it closes at once if that
// agent takes nothing.
func (u *UserspaceDevice) Hand() ([]*os.File, error) {
	rc, err := u.tun.File().SyscallConn()
	fd, derr := -1, error(nil)
	if err == nil {
		err = rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) })
	}
	if err == nil {
		err = derr
	}
	if err != nil {
		u.Close()
		close(u.released)
		return nil, fmt.Errorf("keep TUN device %s open: %w", u.name, err)
	}
	files := []*os.File{os.NewFile(uintptr(fd), u.name)}
	relay, err := u.handOver()
	if err != nil {
		// The next agent carries on without the sessions.
		u.log.Error(err, "no relay for the new agent: this device's sessions end now")
		u.Close()
		close(u.released)
		return files, nil
	}
	return append(files, relay), nil
}

// handOver makes the relay, and serves the take on it: the other end is
// the next agent's.
func (u *UserspaceDevice) handOver() (*os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	local := os.NewFile(uintptr(pair[0]), "relay")
	c, err := net.FileConn(local)
	local.Close()
	remote := os.NewFile(uintptr(pair[1]), "relay")
	if err != nil {
		remote.Close()
		return nil, err
	}
	go u.serveTake(c.(*net.UnixConn))
	return remote, nil
}

// awaitTake keeps a device handed over down until its first configuration
// with a key, when it takes the port over relay (handoff.go).
func (u *UserspaceDevice) awaitTake(relay *net.UnixConn) { u.down, u.relay = true, relay }

// Released is closed once a device handed over is done serving.
func (u *UserspaceDevice) Released() <-chan struct{} { return u.released }

// serveTake answers the next agent's take on relay: the TUN device is no
// longer read here and the sockets go to that agent, and the sessions made here
// are decrypted relayWindow longer.
func (u *UserspaceDevice) serveTake(relay *net.UnixConn) {
	defer close(u.released)
	defer u.Close()
	m := make([]byte, 16)
	if n, err := relay.Read(m); err != nil || n != 1 || m[0] != relayTake {
		// It went away, or opened a device of its own.
		relay.Close()
		return
	}
	indices := u.bind.made.live(time.Now())
	if err := u.bind.handOver(relay, indices); err != nil {
		relay.Close()
		return
	}
	u.tun.halt()
	// The sockets, the new agent's now, close here; the relay opens.
	if err := u.dev.BindUpdate(); err != nil {
		u.log.Error(err, "letting go of the WireGuard port")
	}
	if err := portClosed(relay, time.Now()); err != nil {
		return
	}
	u.log.Info("the new agent took the WireGuard port; decrypting this device's sessions a moment longer", "sessions", len(indices), "for", relayWindow)
	<-time.After(relayWindow)
}
