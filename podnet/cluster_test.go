package podnet_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
)

// cluster is a cluster of real `netplane --role=node` processes on two
// underlay subnets: node1 and node2 on subnet A (192.168.10.0/24,
// fd00:a::/64, a bridge in a switch namespace), node3 on subnet B
// (192.168.20.0/24, fd00:b::/64), joined by a router namespace that knows
// nothing of pod CIDRs, and an external client on subnet A. Node objects
// live in a real API server; pods are made through the conflist and plugin
// the agents install, as a runtime does. Nodes filter by reverse path
// strictly, so an asymmetric path shows up as a failure.
type cluster struct {
	*testcluster.Cluster
	t     *testing.T // the test the cluster lives as long as
	ext   *netns.NS
	nodes []*clusterNode
}

type clusterNode struct {
	*testcluster.Node
	c *testcluster.Cluster
}

// newCluster builds the cluster and starts netplane on every node with
// args added.
func newCluster(t *testing.T, args ...string) *cluster {
	t.Helper()
	c := &cluster{t: t}
	c.Cluster = testcluster.New(t, testcluster.Options{
		Nodes: 3, IPv6: true, NoDAD: true,
		Subnets: []testcluster.Subnet{
			{V4: "192.168.10.", V6: "fd00:a::", Gateway: "192.168.10.254", Gateway6: "fd00:a::fe", Routed: true},
			{V4: "192.168.20.", V6: "fd00:b::", Bridge: testcluster.Link, Gateway: "192.168.20.254", Gateway6: "fd00:b::fe", Routed: true},
		},
		Place: func(i int) (int, string) { return i / 3, fmt.Sprintf("1%d", i) },
		Setup: func(t testing.TB, n *testcluster.Node) {
			n.NS.Sysctl(t, "net.ipv4.conf.all.rp_filter", "1")
			n.NS.Sysctl(t, "net.ipv4.conf.default.rp_filter", "1")
			// Off, so that the test sees the agent turn them on.
			n.NS.Sysctl(t, "net.bridge.bridge-nf-call-iptables", "0")
			n.NS.Sysctl(t, "net.bridge.bridge-nf-call-ip6tables", "0")
		},
		Flags: func(*testcluster.Node) []string { return append([]string{"--min-sync-period=100ms"}, args...) },
	})
	for _, n := range c.Nodes {
		c.nodes = append(c.nodes, &clusterNode{Node: n, c: c.Cluster})
	}
	c.ext, _, _ = c.AddHost(t, "ext", 0, "100", "64")
	c.ext.Route(t, "default", "via", "192.168.10.254")
	c.ext.Route(t, "default", "via", "fd00:a::fe")
	return c
}

// start starts netplane --role=node on every node, with args added, and
// waits for its conflist and plugin.
func (c *cluster) start(t *testing.T, args ...string) {
	t.Helper()
	for _, n := range c.nodes {
		c.Start(t, n.Node, append([]string{"--min-sync-period=100ms"}, args...)...)
	}
	for _, n := range c.nodes {
		c.WaitForCNI(t, n.Node)
	}
}

// stop stops netplane on every node with SIGTERM, as a rolling upgrade does.
func (c *cluster) stop() {
	for _, n := range c.nodes {
		c.Stop(n.Node)
	}
}

func (c *cluster) node(i int) *clusterNode { return c.nodes[i-1] }

// echoPort is where the pods' echo servers (netns.ServeEcho) listen, TCP
// and UDP.
const echoPort = "8080"

// pod is a pod made through the CNI plugin, with servers answering in it.
type pod struct{ *testcluster.Pod }

// addPod makes a pod namespace on n through the conflist and plugin the
// agent installed, as a runtime would, and checks its MTU.
func (n *clusterNode) addPod(t *testing.T, id string, mtu int) *pod {
	t.Helper()
	p := &pod{n.c.AddPod(t, n.Node, id)}
	if out := p.NS.MustExec(t, "ip", "link", "show", "eth0"); !strings.Contains(out, fmt.Sprintf("mtu %d ", mtu)) {
		t.Fatalf("pod %s: eth0 does not have the pod MTU %d:\n%s", id, mtu, out)
	}
	p.NS.ServeEcho(t, ":"+echoPort, id)
	return p
}

// address is the pod's address of family fam (4 or 6).
func (p *pod) address(fam int) string {
	if fam == 6 {
		return p.IP6
	}
	return p.IP
}

// at is the pod's address of family fam with port, for dialing.
func (p *pod) at(fam int, port string) string { return net.JoinHostPort(p.address(fam), port) }

// who asks the server at addr, over network (tcp or udp), from inside ns,
// at which address it sees the client.
func who(ns *netns.NS, network, addr string) (string, error) {
	if network == "udp" {
		return ns.SeenUDP(addr)
	}
	return ns.SeenTCP(addr)
}

// expectWho waits until the server at addr sees a client in from at want.
func expectWho(t *testing.T, from *netns.NS, network, addr, want string) {
	t.Helper()
	framework.Eventually(t, 20*time.Second, fmt.Sprintf("%s to %s from %s", network, addr, from.Name), func() error {
		got, err := who(from, network, addr)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("the server saw the client at %s, want %s", got, want)
		}
		return nil
	})
}

// unreachable fails unless addr goes unanswered from ns.
func unreachable(t *testing.T, from *netns.NS, addr string) {
	t.Helper()
	if got, err := who(from, "tcp", addr); err == nil {
		t.Errorf("tcp to %s from %s answered (%s), want no path", addr, from.Name, got)
	}
}

// hold opens a TCP connection from ns to the server at addr, kept open.
func hold(t *testing.T, ns *netns.NS, addr string) *netns.EchoConn {
	t.Helper()
	c, err := ns.DialEcho(addr, netns.EchoTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// probe counts the UDP packets a node sends to the VXLAN port, and those
// of them that carry the VNI (bits 32-55 of the VXLAN header, after the
// 8-byte UDP header).
func probe(t *testing.T, ns *netns.NS, port, vni int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "probe.nft")
	os.WriteFile(path, []byte(fmt.Sprintf(`table inet probe {
	counter vxlan {}
	counter vni {}
	chain out {
		type filter hook output priority 0;
		udp dport %d counter name vxlan
		udp dport %d @th,96,24 %d counter name vni
	}
}
`, port, port, vni)), 0o644)
	ns.MustExec(t, "nft", "-f", path)
}

var packets = regexp.MustCompile(`packets (\d+)`)

// count is a probe counter's packets.
func count(t *testing.T, ns *netns.NS, name string) int {
	t.Helper()
	out := ns.MustExec(t, "nft", "list", "counter", "inet", "probe", name)
	m := packets.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no packet count in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// shows is the output of a command in a node, with runs of spaces as one;
// "" when it fails (an object that is not there).
func (n *clusterNode) shows(args ...string) string {
	out, err := n.NS.Exec(args[0], args[1:]...)
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(out), " ")
}
