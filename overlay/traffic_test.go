package overlay_test

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

	"github.com/netplane/netplane/e2e/netns"
)

const (
	tcpPort = "8080"
	udpPort = "8081"
	timeout = 2 * time.Second
)

// serve runs, inside ns, a TCP server that answers "whoami" with the
// client's address as it sees it and "echo" by echoing until EOF, and a
// UDP server that answers every datagram with the sender's address.
func serve(t testing.TB, ns *netns.NS) {
	t.Helper()
	l, err := ns.Listen(":" + tcpPort)
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp", ":"+udpPort); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
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

func handle(c net.Conn) {
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

// dial opens a TCP connection from inside ns.
func dial(ns *netns.NS, ip string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip, tcpPort), timeout)
		return err
	})
	return c, err
}

// whoami asks over c who the server sees.
func whoami(c net.Conn) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "whoami\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// seenTCP is the client address the server at ip sees on a new connection.
func seenTCP(from *netns.NS, ip string) (string, error) {
	c, err := dial(from, ip)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return whoami(c)
}

// seenUDP is the client address the server at ip sees in a datagram.
func seenUDP(from *netns.NS, ip string) (string, error) {
	var c net.Conn
	if err := from.Do(func() (err error) { c, err = net.Dial("udp", net.JoinHostPort(ip, udpPort)); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 100)
	for range 3 { // a datagram may be lost while neighbours resolve
		c.SetDeadline(time.Now().Add(timeout / 2))
		if _, err := c.Write([]byte("who")); err != nil {
			return "", err
		}
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", ip)
}

// echoBytes sends size random bytes to the echo server at ip and checks
// that the same bytes come back: a transfer of size each way.
func echoBytes(from *netns.NS, ip string, size int) error {
	c, err := dial(from, ip)
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

// expectSeen checks that a TCP and a UDP exchange from `from` to ip works
// and that the server sees want as the source.
func expectSeen(t *testing.T, from *netns.NS, ip, want string) {
	t.Helper()
	if got, err := seenTCP(from, ip); err != nil || got != want {
		t.Errorf("TCP from %s to %s: server saw %q (%v), want %s", from.Name, ip, got, err, want)
	}
	if got, err := seenUDP(from, ip); err != nil || got != want {
		t.Errorf("UDP from %s to %s: server saw %q (%v), want %s", from.Name, ip, got, err, want)
	}
}

// expectUnreachable checks that TCP from `from` to ip fails. Nothing
// answers with an error (the router has no route back to a pod either), so
// a connection attempt only times out; a second is plenty in namespaces.
func expectUnreachable(t *testing.T, from *netns.NS, ip string) {
	t.Helper()
	err := from.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, tcpPort), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("TCP from %s to %s works; want it to fail", from.Name, ip)
	}
}
