package wireguard_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/netns"
)

// capture records every frame that crosses one interface of a test
// namespace, through an AF_PACKET socket opened in that namespace (this
// machine has no tcpdump).
type capture struct {
	ifname string
	f      *os.File
	done   chan struct{}

	mu     sync.Mutex
	frames [][]byte
}

// startCapture captures on ifname in ns until stop or the end of the test.
func startCapture(t *testing.T, ns *netns.NS, ifname string) *capture {
	t.Helper()
	c := &capture{ifname: ifname, done: make(chan struct{})}
	proto := int(htons(unix.ETH_P_ALL))
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		// Non-blocking, so that the runtime's poller wakes the reader and
		// Close ends it.
		c.f = os.NewFile(uintptr(fd), "capture-"+ifname)
		return nil
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", ifname, ns.Name, err)
	}
	go c.read()
	t.Cleanup(c.stop)
	return c
}

func (c *capture) read() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		n, err := c.f.Read(buf)
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		c.mu.Lock()
		c.frames = append(c.frames, append([]byte(nil), buf[:n]...))
		c.mu.Unlock()
	}
}

// stop ends the capture and returns its frames.
func (c *capture) stop() {
	c.f.Close()
	<-c.done
}

func (c *capture) Frames() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// packet is what the checks need of one captured frame.
type packet struct {
	etherType        uint16
	proto            uint8 // IP protocol; 0 when not IPv4
	src, dst         net.IP
	srcPort, dstPort uint16
}

func (p packet) String() string {
	if p.proto == 0 {
		return fmt.Sprintf("ethertype %#04x", p.etherType)
	}
	return fmt.Sprintf("IPv4 proto %d %s:%d > %s:%d", p.proto, p.src, p.srcPort, p.dst, p.dstPort)
}

// parse reads the Ethernet and IPv4 headers, and the ports of UDP and TCP.
func parse(frame []byte) packet {
	if len(frame) < 14 {
		return packet{}
	}
	p := packet{etherType: binary.BigEndian.Uint16(frame[12:14])}
	ip := frame[14:]
	if p.etherType != 0x0800 || len(ip) < 20 {
		return p
	}
	p.proto, p.src, p.dst = ip[9], net.IP(ip[12:16]), net.IP(ip[16:20])
	l4 := ip[int(ip[0]&0x0f)*4:]
	if (p.proto == unix.IPPROTO_UDP || p.proto == unix.IPPROTO_TCP) && len(l4) >= 4 {
		p.srcPort, p.dstPort = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
	}
	return p
}
