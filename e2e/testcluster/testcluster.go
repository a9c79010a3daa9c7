// Package testcluster is the rig of every test that needs nodes: an
// underlay of subnets in network namespaces, each a bridge in a switch
// namespace, a bridge in a router namespace, or a link from the router to
// one node; one namespace per node. By default a real kube-apiserver
// (e2e/framework) holds a Node per node and each node runs
// `netplane --role=node` with a kubeconfig through a forwarder to it; pods
// are made through the CNI plugin the agents install, as a runtime would,
// and their Pod objects written as a kubelet would. The tests of one node
// feature's shell take the underlay and nodes alone (NoAPIServer) and wire
// pods by hand (handmade.go). Everything is removed when the test ends
// (e2e/netns).
package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/podnet"
)

// Bridge is where a subnet's hosts meet.
type Bridge int

const (
	// InSwitch: a bridge in a switch namespace of its own; the router, when
	// the subnet is routed, joins it by a link.
	InSwitch Bridge = iota
	// InRouter: a bridge in the router namespace.
	InRouter
	// Link: no bridge, a link from the router to the subnet's one node.
	Link
)

// Subnet is one underlay subnet. Addresses on it are V4 or V6 followed by
// a host part ("192.168.1." + "11").
type Subnet struct {
	V4, V6 string // "192.168.1.", "fd00:a::"; V6 "": IPv4 only (a /24 and a /64)
	Bridge Bridge
	// Gateway and Gateway6 are the default routes of its nodes ("" none);
	// when Routed, the router holds them on the subnet.
	Gateway, Gateway6 string
	Routed            bool
}

// Options say what differs between clusters; the zero value is two nodes on
// one IPv4 subnet 192.168.77.0/24 with no default route.
type Options struct {
	Nodes   int                                   // 2 when 0
	Subnets []Subnet                              // one InSwitch 192.168.77.0/24 when empty
	Place   func(i int) (subnet int, host string) // node i (from 1); subnet 0, host 10+i when nil
	IPv6    bool                                  // dual-stack pod CIDRs 10.244.<i>.0/24, fd00:10:244:<i>::/64
	NoDAD   bool                                  // namespaces without IPv6 duplicate address detection
	// NoAPIServer: the underlay and the nodes only, no API server, Node
	// objects or agents; the test drives a feature's shell in the nodes.
	NoAPIServer bool
	APIServer   framework.Options
	// ClusterCIDRs are the agents' --cluster-cidr; 10.244.0.0/16 (and
	// fd00:10:244::/48 with IPv6) when empty.
	ClusterCIDRs []string
	// NoPodCIDRs: the Node objects have no pod CIDR, so an agent's pod
	// network waits and the test wires pods by hand.
	NoPodCIDRs bool
	Timeout    time.Duration // of Ctx; 20 minutes when 0
	// Setup runs in each node's namespace once it is addressed, before its
	// agent starts.
	Setup func(t testing.TB, n *Node)
	// Flags are the agent's flags beyond the ones every agent gets, at the
	// start New makes.
	Flags func(n *Node) []string
	// NoStart: New starts no agents (Start them).
	NoStart bool
	// DelPods: pods are deleted through the CNI plugin when their test ends.
	DelPods bool
}

// Cluster is the API server, the underlay and the nodes.
type Cluster struct {
	T      testing.TB           // the test the cluster lives as long as; owns the agents
	API    *framework.APIServer // nil with NoAPIServer
	Ctx    context.Context
	Switch *netns.NS // the InSwitch subnets' namespace (bridge br<subnet>), or nil
	Router *netns.NS // or nil when no subnet is routed
	Nodes  []*Node
	opts   Options
}

// Node is one node's namespace and agent.
type Node struct {
	Name, IP, IP6 string
	Index         int    // from 1
	Link          string // its link's name on the switch's or the router's side, for captures
	NS            *netns.NS
	Dir           string
	Kubeconfig    string // "" with NoAPIServer
	Proc          *framework.Process
	Metrics       string          // the agent's metrics address inside NS, once Served
	bridges       map[string]bool // made for hand-made pods
}

func (n *Node) ConfDir() string { return filepath.Join(n.Dir, "net.d") }
func (n *Node) BinDir() string  { return filepath.Join(n.Dir, "bin") }
func (n *Node) IPAMDir() string { return filepath.Join(n.Dir, "ipam") }

// New brings the cluster up: API server, underlay, nodes with their Node
// objects and, unless NoStart, agents whose CNI plugins are installed.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	framework.RequireRoot(t)
	if !o.NoAPIServer {
		_, err := os.Stat("/proc/sys/net/bridge")
		framework.Require(t, err == nil, "br_netfilter is not loaded (modprobe br_netfilter)")
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if len(o.Subnets) == 0 {
		o.Subnets = []Subnet{{V4: "192.168.77."}}
	}
	if o.Place == nil {
		o.Place = func(i int) (int, string) { return 0, fmt.Sprint(10 + i) }
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	c := &Cluster{T: t, opts: o}
	if !o.NoAPIServer {
		c.API = framework.StartAPIServer(t, o.APIServer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	t.Cleanup(cancel)
	c.Ctx = ctx
	c.underlay(t)
	for i := 1; i <= o.Nodes; i++ {
		c.Nodes = append(c.Nodes, c.addNode(t, i))
	}
	if o.NoAPIServer || o.NoStart {
		return c
	}
	for _, n := range c.Nodes {
		c.Start(t, n, c.flags(n)...)
	}
	for _, n := range c.Nodes {
		c.WaitForCNI(t, n)
	}
	return c
}

func (c *Cluster) flags(n *Node) []string {
	if c.opts.Flags == nil {
		return nil
	}
	return c.opts.Flags(n)
}

func (c *Cluster) newNS(t testing.TB, label string) *netns.NS {
	if c.opts.NoDAD {
		return netns.NewNoDAD(t, label)
	}
	return netns.New(t, label)
}

func (c *Cluster) host(t testing.TB, label string, peer *netns.NS, peerIf, hostIf string) *netns.NS {
	if c.opts.NoDAD {
		return netns.HostNoDAD(t, label, peer, peerIf, hostIf)
	}
	return netns.Host(t, label, peer, peerIf, hostIf)
}

func bridgeName(s int) string { return fmt.Sprintf("br%d", s) }

// underlay makes the switch and router namespaces and the subnets' bridges
// and router addresses; the links to nodes come with them.
func (c *Cluster) underlay(t testing.TB) {
	for i, s := range c.opts.Subnets {
		if s.Routed && c.Router == nil {
			c.Router = c.newNS(t, "router")
			c.Router.Sysctl(t, "net.ipv4.ip_forward", "1")
			c.Router.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
		}
		switch s.Bridge {
		case InSwitch:
			if c.Switch == nil {
				c.Switch = c.newNS(t, "switch")
			}
			c.Switch.Bridge(t, bridgeName(i))
			if s.Routed {
				ifname := fmt.Sprintf("eth-%d", i)
				netns.Veth(t, c.Router, ifname, c.Switch, "r-"+fmt.Sprint(i))
				c.Switch.Attach(t, "r-"+fmt.Sprint(i), bridgeName(i))
				c.routerAddrs(t, ifname, s)
			}
		case InRouter:
			c.Router.Bridge(t, bridgeName(i))
			c.routerAddrs(t, bridgeName(i), s)
		}
	}
}

func (c *Cluster) routerAddrs(t testing.TB, ifname string, s Subnet) {
	c.Router.Addr(t, ifname, s.Gateway+"/24")
	if s.Gateway6 != "" {
		c.Router.Addr(t, ifname, s.Gateway6+"/64")
	}
}

// AddHost makes a namespace with an eth0 on subnet s at host (and host6,
// when the subnet has IPv6); its routes are the caller's. The link's other
// end is "u-"+label.
func (c *Cluster) AddHost(t testing.TB, label string, s int, host, host6 string) (ns *netns.NS, ip, ip6 string) {
	t.Helper()
	sub, link := c.opts.Subnets[s], "u-"+label
	switch sub.Bridge {
	case InSwitch:
		ns = c.host(t, label, c.Switch, link, "eth0")
		c.Switch.Attach(t, link, bridgeName(s))
	case InRouter:
		ns = c.host(t, label, c.Router, link, "eth0")
		c.Router.Attach(t, link, bridgeName(s))
	case Link:
		ns = c.host(t, label, c.Router, link, "eth0")
		c.routerAddrs(t, link, sub)
	}
	ip = sub.V4 + host
	ns.Addr(t, "eth0", ip+"/24")
	if sub.V6 != "" {
		ip6 = sub.V6 + host6
		ns.Addr(t, "eth0", ip6+"/64")
	}
	return ns, ip, ip6
}

// addNode makes node i's namespace, routes, kubeconfig and Node object.
func (c *Cluster) addNode(t testing.TB, i int) *Node {
	s, host := c.opts.Place(i)
	n := &Node{Name: fmt.Sprintf("node%d", i), Index: i, Dir: t.TempDir()}
	n.Link = "u-" + n.Name
	n.NS, n.IP, n.IP6 = c.AddHost(t, n.Name, s, host, host)
	sub := c.opts.Subnets[s]
	if sub.Gateway != "" {
		n.NS.Route(t, "default", "via", sub.Gateway)
	}
	if sub.Gateway6 != "" {
		n.NS.Route(t, "default", "via", sub.Gateway6)
	}
	if c.opts.Setup != nil {
		c.opts.Setup(t, n)
	}
	if c.API == nil {
		return n
	}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	if !c.opts.NoPodCIDRs {
		obj.Spec.PodCIDRs = PodCIDRs(i, c.opts.IPv6)
		obj.Spec.PodCIDR = obj.Spec.PodCIDRs[0]
	}
	created, err := c.API.Client.CoreV1().Nodes().Create(c.Ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.SetAddresses(t, created, n.IP, n.IP6)
	fwd := n.NS.Forward(t, "127.0.0.1:0", strings.TrimPrefix(c.API.URL, "https://"))
	n.Kubeconfig = filepath.Join(n.Dir, "kubeconfig")
	if err := c.API.WriteKubeconfig(n.Kubeconfig, "https://"+fwd, c.API.Token); err != nil {
		t.Fatal(err)
	}
	return n
}

// PodCIDRs are node i's pod CIDRs: 10.244.<i>.0/24 and, with ipv6,
// fd00:10:244:<i>::/64.
func PodCIDRs(i int, ipv6 bool) []string {
	cidrs := []string{fmt.Sprintf("10.244.%d.0/24", i)}
	if ipv6 {
		cidrs = append(cidrs, fmt.Sprintf("fd00:10:244:%d::/64", i))
	}
	return cidrs
}

// SetAddresses writes the InternalIPs of Node obj, what a kubelet would;
// empty ones are left out.
func (c *Cluster) SetAddresses(t testing.TB, obj *v1.Node, ips ...string) {
	t.Helper()
	obj.Status.Addresses = nil
	for _, ip := range ips {
		if ip != "" {
			obj.Status.Addresses = append(obj.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
		}
	}
	if _, err := c.API.Client.CoreV1().Nodes().UpdateStatus(c.Ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Start starts `netplane --role=node` on n with the flags every agent gets
// and flags. The process and its log belong to the cluster's test, whichever
// subtest starts it.
func (c *Cluster) Start(t testing.TB, n *Node, flags ...string) {
	t.Helper()
	cidrs := c.opts.ClusterCIDRs
	if len(cidrs) == 0 {
		cidrs = []string{"10.244.0.0/16"}
		if c.opts.IPv6 {
			cidrs = append(cidrs, "fd00:10:244::/48")
		}
	}
	cidr := "--cluster-cidr=" + strings.Join(cidrs, ",")
	// No --cni-plugin-path: the agent installs the netplane-cni beside it.
	args := append([]string{"--role=node", "--kubeconfig=" + n.Kubeconfig, "--node-name=" + n.Name,
		"--cni-conf-dir=" + n.ConfDir(), "--cni-bin-dir=" + n.BinDir(), "--ipam-state-dir=" + n.IPAMDir(),
		cidr, "--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0"}, flags...)
	n.Metrics = ""
	n.Proc = n.NS.Start(c.T, filepath.Join(framework.NetplaneBinaries(t), "netplane"), args...)
}

// Stop stops n's agent with SIGTERM, as a rolling upgrade does.
func (c *Cluster) Stop(n *Node) { n.Proc.Stop(15 * time.Second) }

// WaitForCNI waits until n's agent has installed its conflist and plugin,
// and fails when the agent exits first.
func (c *Cluster) WaitForCNI(t testing.TB, n *Node) {
	t.Helper()
	framework.Eventually(t, 60*time.Second, "conflist and plugin on "+n.Name, func() error {
		if n.Proc.Exited() {
			t.Fatalf("netplane on %s exited:\n%s", n.Name, n.Proc.Tail(30))
		}
		for _, f := range []string{filepath.Join(n.ConfDir(), podnet.ConflistName), filepath.Join(n.BinDir(), "netplane-cni")} {
			if _, err := os.Stat(f); err != nil {
				return err
			}
		}
		return nil
	})
}

// Served waits until n's agent serves health and metrics, and keeps the
// metrics address for Metric.
func (n *Node) Served(t testing.TB) {
	t.Helper()
	_, n.Metrics = framework.ServedAddresses(t, n.Proc, 60*time.Second)
}
