package podnet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
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
	t      *testing.T // the test the cluster lives as long as
	api    *framework.APIServer
	router *netns.NS
	ext    *netns.NS
	nodes  []*clusterNode
}

type clusterNode struct {
	name, ip, ip6 string
	ns            *netns.NS
	dir           string
	kubeconfig    string
	proc          *framework.Process
}

func (n *clusterNode) confDir() string { return filepath.Join(n.dir, "net.d") }
func (n *clusterNode) binDir() string  { return filepath.Join(n.dir, "bin") }

// newCluster builds the cluster and starts netplane on every node with
// args added.
func newCluster(t *testing.T, args ...string) *cluster {
	t.Helper()
	framework.RequireRoot(t)
	c := &cluster{t: t, api: framework.StartAPIServer(t, framework.Options{})}
	sw := newNS(t, "switch")
	sw.Bridge(t, "br0")
	c.router = host(t, "router", sw, "r-a", "eth-a")
	sw.Attach(t, "r-a", "br0")
	c.router.Addr(t, "eth-a", "192.168.10.254/24")
	c.router.Addr(t, "eth-a", "fd00:a::fe/64")
	c.router.Sysctl(t, "net.ipv4.ip_forward", "1")
	c.router.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	c.ext = host(t, "ext", sw, "u-ext", "eth0")
	sw.Attach(t, "u-ext", "br0")
	c.ext.Addr(t, "eth0", "192.168.10.100/24")
	c.ext.Addr(t, "eth0", "fd00:a::64/64")
	c.ext.Route(t, "default", "via", "192.168.10.254")
	c.ext.Route(t, "default", "via", "fd00:a::fe")
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("node%d", i)
		n := &clusterNode{name: name, dir: t.TempDir()}
		gw4, gw6 := "192.168.10.254", "fd00:a::fe"
		if i < 3 {
			n.ns = host(t, name, sw, "u-"+name, "eth0")
			sw.Attach(t, "u-"+name, "br0")
			n.ip, n.ip6 = fmt.Sprintf("192.168.10.1%d", i), fmt.Sprintf("fd00:a::1%d", i)
		} else {
			n.ns = host(t, name, c.router, "u-"+name, "eth0")
			c.router.Addr(t, "u-"+name, "192.168.20.254/24")
			c.router.Addr(t, "u-"+name, "fd00:b::fe/64")
			n.ip, n.ip6 = fmt.Sprintf("192.168.20.1%d", i), fmt.Sprintf("fd00:b::1%d", i)
			gw4, gw6 = "192.168.20.254", "fd00:b::fe"
		}
		n.ns.Addr(t, "eth0", n.ip+"/24")
		n.ns.Addr(t, "eth0", n.ip6+"/64")
		n.ns.Route(t, "default", "via", gw4)
		n.ns.Route(t, "default", "via", gw6)
		n.ns.Sysctl(t, "net.ipv4.conf.all.rp_filter", "1")
		n.ns.Sysctl(t, "net.ipv4.conf.default.rp_filter", "1")
		// Off, so that the test sees the agent turn them on.
		n.ns.Sysctl(t, "net.bridge.bridge-nf-call-iptables", "0")
		n.ns.Sysctl(t, "net.bridge.bridge-nf-call-ip6tables", "0")
		c.createNode(t, name, i, n.ip, n.ip6)
		fwd := n.ns.Forward(t, "127.0.0.1:0", strings.TrimPrefix(c.api.URL, "https://"))
		n.kubeconfig = filepath.Join(n.dir, "kubeconfig")
		if err := c.api.WriteKubeconfig(n.kubeconfig, "https://"+fwd, c.api.Token); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	c.start(t, args...)
	return c
}

// createNode makes the Node object of node i with its pod CIDRs and
// InternalIPs (what kube-controller-manager and the kubelet would write).
func (c *cluster) createNode(t *testing.T, name string, i int, ips ...string) {
	t.Helper()
	cidrs := []string{fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}}
	created, err := c.api.Client.CoreV1().Nodes().Create(framework.Ctx(t), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.setAddresses(t, created, ips...)
}

// setAddresses writes the InternalIPs of Node n.
func (c *cluster) setAddresses(t *testing.T, n *v1.Node, ips ...string) {
	t.Helper()
	n.Status.Addresses = nil
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	if _, err := c.api.Client.CoreV1().Nodes().UpdateStatus(framework.Ctx(t), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// start starts netplane --role=node on every node, with args added, and
// waits for its conflist and plugin. The processes and their logs belong
// to the cluster's test, whichever subtest starts them.
func (c *cluster) start(t *testing.T, args ...string) {
	t.Helper()
	bins := framework.NetplaneBinaries(t)
	for _, n := range c.nodes {
		// No --cni-plugin-path: the agent installs the netplane-cni beside it.
		n.proc = n.ns.Start(c.t, filepath.Join(bins, "netplane"), append([]string{
			"--role=node", "--kubeconfig=" + n.kubeconfig, "--node-name=" + n.name,
			"--cni-conf-dir=" + n.confDir(), "--cni-bin-dir=" + n.binDir(),
			"--ipam-state-dir=" + filepath.Join(n.dir, "ipam"),
			"--cluster-cidr=10.244.0.0/16,fd00:10:244::/48", "--min-sync-period=100ms",
			"--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0"}, args...)...)
	}
	for _, n := range c.nodes {
		framework.Eventually(t, 60*time.Second, "conflist and plugin on "+n.name, func() error {
			if n.proc.Exited() {
				t.Fatalf("netplane on %s exited:\n%s", n.name, n.proc.Tail(30))
			}
			if _, err := os.Stat(filepath.Join(n.binDir(), "netplane-cni")); err != nil {
				return err
			}
			_, err := os.Stat(filepath.Join(n.confDir(), podnet.ConflistName))
			return err
		})
	}
}

// stop stops netplane on every node with SIGTERM, as a rolling upgrade does.
func (c *cluster) stop() {
	for _, n := range c.nodes {
		n.proc.Stop(10 * time.Second)
	}
}

func (c *cluster) node(i int) *clusterNode { return c.nodes[i-1] }

var (
	newNS = netns.NewNoDAD
	host  = netns.HostNoDAD
)

// echoPort is where the pods' echo servers (netns.ServeEcho) listen, TCP
// and UDP.
const echoPort = "8080"

// pod is a pod made through the CNI plugin, with servers answering in it.
type pod struct {
	ns      *netns.NS
	ip, ip6 string
}

// addPod makes a pod namespace on n through the conflist and plugin the
// agent installed, as a runtime would, and checks its MTU.
func (n *clusterNode) addPod(t *testing.T, id string, mtu int) *pod {
	t.Helper()
	p := &pod{ns: newNS(t, "pod")}
	list, err := libcni.ConfListFromFile(filepath.Join(n.confDir(), podnet.ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, filepath.Join(n.dir, "cache"), nil)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: p.ns.Path, IfName: "eth0"}
	var res *current.Result
	err = n.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(raw)
		return err
	})
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", id, n.name, err)
	}
	if len(res.IPs) != 2 {
		t.Fatalf("pod %s got %v, want an address per family", id, res.IPs)
	}
	if out := p.ns.MustExec(t, "ip", "link", "show", "eth0"); !strings.Contains(out, fmt.Sprintf("mtu %d ", mtu)) {
		t.Fatalf("pod %s: eth0 does not have the pod MTU %d:\n%s", id, mtu, out)
	}
	p.ip, p.ip6 = res.IPs[0].Address.IP.String(), res.IPs[1].Address.IP.String()
	p.ns.ServeEcho(t, ":"+echoPort, id)
	return p
}

// address is the pod's address of family fam (4 or 6).
func (p *pod) address(fam int) string {
	if fam == 6 {
		return p.ip6
	}
	return p.ip
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
	out, err := n.ns.Exec(args[0], args[1:]...)
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(out), " ")
}
