package overlay_test

import (
	"net"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/netns"
)

// echoPort is where the pods' echo servers (netns.ServeEcho) listen, TCP
// and UDP.
const echoPort = "8080"

const timeout = netns.EchoTimeout

// serve runs the echo servers in ns until the test ends.
func serve(t testing.TB, ns *netns.NS) { ns.ServeEcho(t, ":"+echoPort, ns.Name) }

// at is the address of the echo servers on ip.
func at(ip string) string { return net.JoinHostPort(ip, echoPort) }

// dial opens a TCP connection from inside ns to the server on ip.
func dial(ns *netns.NS, ip string) (*netns.EchoConn, error) { return ns.DialEcho(at(ip), timeout) }

// whoami asks the server over c at which address it sees the client.
func whoami(c *netns.EchoConn) (string, error) { return c.Seen() }

// expectSeen checks that a TCP and a UDP exchange from `from` to ip works
// and that the server sees want as the source.
func expectSeen(t *testing.T, from *netns.NS, ip, want string) {
	t.Helper()
	if got, err := from.SeenTCP(at(ip)); err != nil || got != want {
		t.Errorf("TCP from %s to %s: server saw %q (%v), want %s", from.Name, ip, got, err, want)
	}
	if got, err := from.SeenUDP(at(ip)); err != nil || got != want {
		t.Errorf("UDP from %s to %s: server saw %q (%v), want %s", from.Name, ip, got, err, want)
	}
}

// expectUnreachable checks that TCP from `from` to ip fails. Nothing
// answers with an error (the router has no route back to a pod either), so
// a connection attempt only times out; a second is plenty in namespaces.
func expectUnreachable(t *testing.T, from *netns.NS, ip string) {
	t.Helper()
	if got, err := from.Ask("tcp", at(ip), time.Second); err == nil {
		t.Errorf("TCP from %s to %s works (%s); want it to fail", from.Name, ip, got)
	}
}
