package overlay_test

import (
	"net"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/overlay/overlaytest"
)

const timeout = overlaytest.Timeout

var serve = overlaytest.Serve

// at is the address of the test servers' TCP (or UDP) port on ip.
func at(ip, port string) string { return net.JoinHostPort(ip, port) }

// dial opens a TCP connection from inside ns to the server on ip.
func dial(ns *netns.NS, ip string) (net.Conn, error) {
	return overlaytest.Dial(ns, at(ip, overlaytest.TCPPort))
}

var whoami = overlaytest.Whoami

// seenTCP is the client address the server at ip sees on a new connection.
func seenTCP(from *netns.NS, ip string) (string, error) {
	return overlaytest.SeenTCP(from, at(ip, overlaytest.TCPPort))
}

// seenUDP is the client address the server at ip sees in a datagram.
func seenUDP(from *netns.NS, ip string) (string, error) {
	return overlaytest.SeenUDP(from, at(ip, overlaytest.UDPPort))
}

// echoBytes sends size random bytes to the echo server at ip and checks
// that the same bytes come back: a transfer of size each way.
func echoBytes(from *netns.NS, ip string, size int) error {
	return overlaytest.Echo(from, at(ip, overlaytest.TCPPort), size)
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
		c, err := net.DialTimeout("tcp", at(ip, overlaytest.TCPPort), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("TCP from %s to %s works; want it to fail", from.Name, ip)
	}
}
