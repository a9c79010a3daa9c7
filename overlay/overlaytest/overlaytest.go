// Package overlaytest is what the tests of pod traffic between nodes share
// (the overlay's kernel tests, the pod network's cluster tests): network
// namespaces that skip duplicate address detection, a server that tells a
// client at which address it sees it, and the clients that ask it. Tests
// only; nothing of netplane links it.
package overlaytest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/netns"
)

// The ports Serve listens on, and how long a client waits for an answer.
const (
	TCPPort = "8080"
	UDPPort = "8081"
	Timeout = 2 * time.Second
)

// NewNS is a namespace whose interfaces skip IPv6 duplicate address
// detection, link-local addresses included: with it, link-local addresses
// stay tentative for a second or two, neighbour discovery waits, and the
// first connections of a test time out for reasons that have nothing to do
// with what it tests.
func NewNS(t testing.TB, label string) *netns.NS {
	t.Helper()
	ns := netns.New(t, label)
	ns.Sysctl(t, "net.ipv6.conf.all.accept_dad", "0")
	ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
	return ns
}

// Host is netns.Host with NewNS: a namespace linked to peer by a veth,
// hostIf inside it and peerIf in peer.
func Host(t testing.TB, label string, peer *netns.NS, peerIf, hostIf string) *netns.NS {
	t.Helper()
	h := NewNS(t, label)
	netns.Veth(t, h, hostIf, peer, peerIf)
	return h
}

// HandleIn opens a netlink handle bound to ns; it is closed with the test.
func HandleIn(t testing.TB, ns *netns.NS) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	if err := ns.Do(func() (err error) { h, err = netlink.NewHandle(unix.NETLINK_ROUTE); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Serve runs, inside ns, a TCP server on TCPPort that answers "whoami"
// with the client's address as it sees it and "echo" by echoing until EOF,
// and a UDP server on UDPPort that answers every datagram with the
// sender's address. They stop with the test.
func Serve(t testing.TB, ns *netns.NS) {
	t.Helper()
	l, err := ns.Listen(":" + TCPPort)
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", ":"+UDPPort); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go answer(c)
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(addrOf(from)), from)
		}
	}()
}

func answer(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		cmd, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch strings.TrimSpace(cmd) {
		case "whoami":
			fmt.Fprintln(c, addrOf(c.RemoteAddr()))
		case "echo":
			io.Copy(c, r)
			return
		}
	}
}

func addrOf(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	return ap.Addr().Unmap().String()
}

// Dial opens a TCP connection to addr (host:port) from inside ns.
func Dial(ns *netns.NS, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, Timeout)
		return err
	})
	return c, err
}

// Whoami asks the server over c at which address it sees the client. A
// connection asked more than once must be read through one reader: see
// Conn.
func Whoami(c net.Conn) (string, error) { return (&Conn{Conn: c}).Whoami() }

// Conn is a connection to Serve's TCP server kept open for several
// questions.
type Conn struct {
	net.Conn
	r *bufio.Reader
}

// Whoami asks the server at which address it sees the client.
func (c *Conn) Whoami() (string, error) {
	if c.r == nil {
		c.r = bufio.NewReader(c.Conn)
	}
	c.SetDeadline(time.Now().Add(Timeout))
	if _, err := io.WriteString(c, "whoami\n"); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// SeenTCP is the client address the server at addr sees on a new TCP
// connection from ns.
func SeenTCP(from *netns.NS, addr string) (string, error) {
	c, err := Dial(from, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return Whoami(c)
}

// SeenUDP is the client address the server at addr sees in a datagram
// from ns.
func SeenUDP(from *netns.NS, addr string) (string, error) {
	var c net.Conn
	if err := from.Do(func() (err error) { c, err = net.Dial("udp", addr); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 100)
	for range 3 { // a datagram may be lost while neighbours resolve
		c.SetDeadline(time.Now().Add(Timeout / 2))
		if _, err := c.Write([]byte("who")); err != nil {
			return "", err
		}
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", addr)
}

// Echo sends size random bytes to the echo server at addr from ns and
// checks that the same bytes come back: a transfer of size each way.
func Echo(from *netns.NS, addr string, size int) error {
	c, err := Dial(from, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	data := make([]byte, size)
	rand.Read(data)
	if _, err := io.WriteString(c, "echo\n"); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(c)
	if err := errors.Join(<-errc, rerr); err != nil {
		return fmt.Errorf("after %d of %d bytes back: %w", len(got), size, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%d bytes came back, not the %d sent", len(got), size)
	}
	return nil
}
