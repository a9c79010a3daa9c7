package wireguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
)

// portBind is wireguard-go's UDP sockets (a conn.Bind) made here rather
// than by wireguard-go's own bind, so that a running agent can hand them
// to the next one (handoff.go): a socket that passes from process to
// process never closes, and what peers send while it changes hands waits
// in its receive buffer instead of meeting a closed port. wireguard-go's
// bind can neither adopt a socket nor let one be shared (no SO_REUSEPORT
// before its bind). Like it, this bind moves packets in batches
// (recvmmsg, sendmmsg) and lets the kernel split and join them (UDP GSO
// and GRO, offload.go).
type portBind struct {
	mu     sync.Mutex
	socks  []*udpSocket // while open: one per address family
	handed []*os.File   // the last agent's sockets, for the next Open
	mark   uint32
}

type udpSocket struct {
	c    *net.UDPConn
	pc   batchConn
	v6   bool
	port uint16
	// gso: the kernel takes a batch of equal datagrams as one send, until
	// a send of joined ones fails (the path cannot split them).
	gso atomic.Bool
	gro bool // and hands what it joined as one receive
}

// batchConn is x/net's batched I/O, alike for both families.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// socketBuffer is each socket's send and receive buffer: what waits in it
// while the port changes hands, and what absorbs a burst (wireguard-go's
// own bind asks the same).
const socketBuffer = 7 << 20

func newPortBind() *portBind { return &portBind{} }

// adopt gives the next Open sockets the last agent handed over; ones
// not on the port it is asked for are closed then.
func (b *portBind) adopt(files []*os.File) {
	b.mu.Lock()
	defer b.mu.Unlock()
	closeFiles(b.handed)
	b.handed = files
}

// files are copies of the open sockets, to hand over.
func (b *portBind) files() ([]*os.File, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*os.File
	for _, s := range b.socks {
		f, err := s.c.File()
		if err != nil {
			closeFiles(out)
			return nil, fmt.Errorf("hand the WireGuard port's socket over: %w", err)
		}
		out = append(out, f)
	}
	return out, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func (b *portBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.socks != nil {
		return nil, 0, conn.ErrBindAlreadyOpen
	}
	socks := adopted(b.handed, port)
	b.handed = nil
	if socks == nil {
		var err error
		if socks, err = listenPort(port, b.mark); err != nil {
			return nil, 0, err
		}
	}
	b.socks = socks
	fns := make([]conn.ReceiveFunc, len(socks))
	for i, s := range socks {
		fns[i] = s.receive()
	}
	return fns, socks[0].port, nil
}

// adopted makes sockets of files when they are on port (any, for 0);
// else it closes them.
func adopted(files []*os.File, port uint16) []*udpSocket {
	var socks []*udpSocket
	for _, f := range files {
		c, err := net.FilePacketConn(f)
		f.Close()
		uc, ok := c.(*net.UDPConn)
		if err != nil || !ok {
			if c != nil {
				c.Close()
			}
			continue
		}
		socks = append(socks, newSocket(uc))
	}
	for _, s := range socks {
		if port != 0 && s.port != port || s.port != socks[0].port {
			for _, s := range socks {
				s.c.Close()
			}
			return nil
		}
	}
	return socks
}

// listenPort opens a socket for each family on port; when port is 0 the
// kernel's choice for IPv4 is taken for IPv6 too. A kernel without IPv6
// gets the IPv4 socket only.
func listenPort(port uint16, mark uint32) ([]*udpSocket, error) {
	for tries := 0; ; tries++ {
		c4, err := listenUDP("udp4", port, mark)
		if err != nil {
			return nil, fmt.Errorf("WireGuard's UDP port %d: %w", port, err)
		}
		s4 := newSocket(c4)
		c6, err := listenUDP("udp6", s4.port, mark)
		switch {
		case err == nil:
			return []*udpSocket{s4, newSocket(c6)}, nil
		case errors.Is(err, syscall.EAFNOSUPPORT) || errors.Is(err, syscall.EADDRNOTAVAIL):
			return []*udpSocket{s4}, nil
		case port == 0 && errors.Is(err, syscall.EADDRINUSE) && tries < 100:
			c4.Close() // the kernel's choice is taken for IPv6: another
			continue
		}
		c4.Close()
		return nil, fmt.Errorf("WireGuard's UDP port %d over IPv6: %w", s4.port, err)
	}
}

func listenUDP(network string, port uint16, mark uint32) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			for _, o := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF, unix.SO_RCVBUFFORCE, unix.SO_SNDBUFFORCE} {
				// Past net.core.*mem_max only with CAP_NET_ADMIN: best
				// effort, as a smaller buffer is only slower.
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o, socketBuffer)
			}
			if mark != 0 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := lc.ListenPacket(context.Background(), network, ":"+strconv.Itoa(int(port)))
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

func newSocket(c *net.UDPConn) *udpSocket {
	ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
	s := &udpSocket{c: c, port: ap.Port(), v6: !ap.Addr().Unmap().Is4()}
	if s.v6 {
		s.pc = ipv6.NewPacketConn(c)
	} else {
		s.pc = ipv4.NewPacketConn(c)
	}
	gso, gro := enableOffload(c)
	s.gso.Store(gso)
	s.gro = gro
	return s
}

func (b *portBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, s := range b.socks {
		errs = append(errs, s.c.Close())
	}
	b.socks = nil
	return errors.Join(errs...)
}

func (b *portBind) SetMark(mark uint32) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mark = mark
	for _, s := range b.socks {
		rc, err := s.c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("fwmark %d on WireGuard's socket: %w", mark, serr)
		}
	}
	return nil
}

func (b *portBind) BatchSize() int { return conn.IdealBatchSize }

func (b *portBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, err
	}
	return &conn.StdNetEndpoint{AddrPort: ap}, nil
}

// Send sends bufs to ep through the socket of its family.
func (b *portBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	e, ok := ep.(*conn.StdNetEndpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	dst := netip.AddrPortFrom(e.Addr().Unmap(), e.Port())
	b.mu.Lock()
	var s *udpSocket
	for _, c := range b.socks {
		if c.v6 != dst.Addr().Is4() {
			s = c
		}
	}
	b.mu.Unlock()
	if s == nil {
		return fmt.Errorf("send to %s: %w", dst, net.ErrClosed)
	}
	return s.send(bufs, dst)
}
