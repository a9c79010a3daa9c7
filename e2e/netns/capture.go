package netns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Capture records every frame that crosses one interface of a test
// namespace, through an AF_PACKET socket opened in that namespace (the
// test machines have no tcpdump): what a wire shows a listener.
type Capture struct {
	Ifname string
	f      *os.File
	done   chan struct{}
	once   sync.Once

	mu     sync.Mutex
	frames [][]byte
}

// Capture captures on ifname in ns until Stop or the end of the test.
func (ns *NS) Capture(t testing.TB, ifname string) *Capture {
	t.Helper()
	c, err := ns.StartCapture(ifname)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartCapture captures on ifname in ns until Stop, for callers without a
// test (the lab's scenarios).
func (ns *NS) StartCapture(ifname string) (*Capture, error) {
	c := &Capture{Ifname: ifname, done: make(chan struct{})}
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
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
		return nil, fmt.Errorf("capture on %s in %s: %w", ifname, ns.Name, err)
	}
	go c.read()
	return c, nil
}

func (c *Capture) read() {
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

// Stop ends the capture; Frames then holds all it saw.
func (c *Capture) Stop() {
	c.once.Do(func() {
		c.f.Close()
		<-c.done
	})
}

// Frames are the frames captured so far.
func (c *Capture) Frames() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

// Reset forgets the frames captured so far.
func (c *Capture) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frames = nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Packet is what checks need of one captured Ethernet frame.
type Packet struct {
	EtherType        uint16
	Proto            uint8 // IP protocol (IPv6: the first next header); 0 when not IP
	Src, Dst         net.IP
	SrcPort, DstPort uint16 // of UDP and TCP
}

// Ether types and IP protocols the checks name.
const (
	EtherARP   = 0x0806
	EtherIPv4  = 0x0800
	EtherIPv6  = 0x86dd
	ProtoICMP  = 1
	ProtoTCP   = 6
	ProtoUDP   = 17
	ProtoICMP6 = 58
)

func (p Packet) String() string {
	if p.Proto == 0 {
		return fmt.Sprintf("ethertype %#04x", p.EtherType)
	}
	return fmt.Sprintf("IP proto %d %s:%d > %s:%d", p.Proto, p.Src, p.SrcPort, p.Dst, p.DstPort)
}

// Parse reads the Ethernet and IP (v4 or v6) headers, and the ports of
// UDP and TCP.
func Parse(frame []byte) Packet {
	if len(frame) < 14 {
		return Packet{}
	}
	p := Packet{EtherType: binary.BigEndian.Uint16(frame[12:14])}
	ip := frame[14:]
	var l4 []byte
	switch {
	case p.EtherType == EtherIPv4 && len(ip) >= 20:
		p.Proto, p.Src, p.Dst = ip[9], net.IP(ip[12:16]), net.IP(ip[16:20])
		l4 = ip[int(ip[0]&0x0f)*4:]
	case p.EtherType == EtherIPv6 && len(ip) >= 40:
		p.Proto, p.Src, p.Dst = ip[6], net.IP(ip[8:24]), net.IP(ip[24:40])
		l4 = ip[40:]
	default:
		return p
	}
	if (p.Proto == ProtoUDP || p.Proto == ProtoTCP) && len(l4) >= 4 {
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
	}
	return p
}

// SendPayload sends payload from ns to the echo server at addr over TCP
// (echoed back in full, so both directions carry it) and in one UDP
// datagram: what a capture must then never see in clear.
func (ns *NS) SendPayload(addr string, payload []byte) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, EchoTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(EchoTimeout))
		if _, err := c.Write(append([]byte("echo\n"), payload...)); err != nil {
			return err
		}
		got := make([]byte, len(payload))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, payload) {
			return fmt.Errorf("TCP echo of the payload: %v", err)
		}
		u, err := net.DialTimeout("udp", addr, EchoTimeout)
		if err != nil {
			return err
		}
		defer u.Close()
		_ = u.SetDeadline(time.Now().Add(EchoTimeout))
		_, err = u.Write(payload)
		return err
	})
}
