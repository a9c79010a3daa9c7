package netns

import (
	"net"
	"testing"
)

// TestEchoServerAnswersWithItsNameAndTheClientItSees: every way the tests
// ask the echo server, over both families, from a host on a veth.
func TestEchoServerAnswersWithItsNameAndTheClientItSees(t *testing.T) {
	srv := NewNoDAD(t, "srv")
	cli := HostNoDAD(t, "cli", srv, "veth-cli", "eth0")
	srv.Addr(t, "veth-cli", "192.0.2.1/24")
	cli.Addr(t, "eth0", "192.0.2.2/24")
	srv.Addr(t, "veth-cli", "2001:db8::1/64")
	cli.Addr(t, "eth0", "2001:db8::2/64")
	srv.ServeEcho(t, ":8080", "srv")
	for _, tc := range []struct {
		server, client string
	}{{"192.0.2.1", "192.0.2.2"}, {"2001:db8::1", "2001:db8::2"}} {
		addr, want := net.JoinHostPort(tc.server, "8080"), "srv "+tc.client
		for _, network := range []string{"tcp", "udp"} {
			if got, err := cli.Ask(network, addr, EchoTimeout); err != nil || got != want {
				t.Errorf("%s %s: %q, %v; want %q", network, addr, got, err, want)
			}
		}
		c, err := cli.DialEcho(addr, EchoTimeout)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if got, err := c.Seen(); err != nil || got != tc.client {
				t.Errorf("question %d on one connection to %s: %q, %v; want %s", i+1, addr, got, err, tc.client)
			}
		}
		c.Close()
		if err := cli.EchoBytes(addr, 1<<20); err != nil {
			t.Errorf("1 MiB each way to %s: %v", addr, err)
		}
	}
}
