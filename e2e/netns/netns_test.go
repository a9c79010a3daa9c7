package netns

import (
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
)

func TestTwoHostsOnABridgeReachEachOther(t *testing.T) {
	sw := New(t, "switch")
	sw.Bridge(t, "br0")
	a := Host(t, "a", sw, "veth-a", "eth0")
	b := Host(t, "b", sw, "veth-b", "eth0")
	sw.Attach(t, "veth-a", "br0")
	sw.Attach(t, "veth-b", "br0")
	a.Addr(t, "eth0", "192.0.2.1/24")
	b.Addr(t, "eth0", "192.0.2.2/24")
	a.Addr(t, "eth0", "2001:db8::1/64")
	b.Addr(t, "eth0", "2001:db8::2/64")
	a.MustExec(t, "ping", "-c1", "-W2", "192.0.2.2")
	a.MustExec(t, "ping", "-6", "-c1", "-W2", "2001:db8::2")
}

func TestForwardReachesALoopbackServerOfTheTestProcess(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello from the root namespace\n")
			c.Close()
		}
	}()
	ns := New(t, "fwd")
	addr := ns.Forward(t, "127.0.0.1:0", l.Addr().String())
	c, err := ns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(got), "hello") {
		t.Fatalf("got %q through the forwarder", got)
	}
	// The forwarded port exists only inside the namespace.
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("%s is reachable from the root namespace; it must only be inside %s", addr, ns.Name)
	}
}

func TestDeleteRemovesTheNamespaceAndItsProcesses(t *testing.T) {
	ns, err := Create("gone")
	if err != nil {
		t.Skip(err)
	}
	p, err := ns.StartCmd(ns.Command("sleep", "600"), t.TempDir()+"/sleep.log")
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Delete(); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Error("the process started in the namespace still runs")
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), ns.Name) {
		t.Errorf("%s still listed", ns.Name)
	}
}
