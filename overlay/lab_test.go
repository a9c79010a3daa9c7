package overlay_test

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		netns.RemoveStale()
	}
	os.Exit(m.Run())
}

// lab is three nodes in network namespaces: node1 and node2 on underlay
// subnet A (192.168.10.0/24, fd00:a::/64), a bridge in a switch namespace;
// node3 on subnet B (192.168.20.0/24, fd00:b::/64). A router namespace
// joins the subnets and knows nothing of pod CIDRs. Each node has a bridge
// cni0 with its pod CIDR (10.244.<i>.0/24, fd00:10:244:<i>::/64) and one pod
// at .2 / ::2 on it. Nodes filter by reverse path strictly, so an
// asymmetric path shows up as a failure.
type lab struct {
	router *netns.NS
	nodes  []*labNode
}

type labNode struct {
	nodeview.Node
	ns, pod *netns.NS
	h       *netlink.Handle
	podIP   string
	podIP6  string
}

func newLab(t testing.TB) *lab {
	t.Helper()
	sw := newNS(t, "switch")
	sw.Bridge(t, "br0")
	l := &lab{router: host(t, "router", sw, "r-a", "eth-a")}
	sw.Attach(t, "r-a", "br0")
	r := l.router
	r.Addr(t, "eth-a", "192.168.10.254/24")
	r.Addr(t, "eth-a", "fd00:a::fe/64")
	r.Sysctl(t, "net.ipv4.ip_forward", "1")
	r.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	for i := 1; i <= 3; i++ {
		var n *labNode
		if i < 3 {
			n = l.addNode(t, i, sw, "192.168.10", "fd00:a:")
			sw.Attach(t, fmt.Sprintf("u-node%d", i), "br0")
		} else {
			n = l.addNode(t, i, r, "192.168.20", "fd00:b:")
			r.Addr(t, "u-node3", "192.168.20.254/24")
			r.Addr(t, "u-node3", "fd00:b::fe/64")
		}
		n.ns.Route(t, "default", "via", n.gateway(4))
		n.ns.Route(t, "default", "via", n.gateway(6))
	}
	return l
}

// addNode makes node i with its underlay veth towards peer (u-node<i>).
func (l *lab) addNode(t testing.TB, i int, peer *netns.NS, net4, net6 string) *labNode {
	name := fmt.Sprintf("node%d", i)
	n := &labNode{ns: host(t, name, peer, "u-"+name, "eth0")}
	ip, ip6 := fmt.Sprintf("%s.1%d", net4, i), fmt.Sprintf("%s:1%d", net6, i)
	cidr, cidr6 := fmt.Sprintf("10.244.%d.0/24", i), fmt.Sprintf("fd00:10:244:%d::/64", i)
	n.Node = nodeview.Node{Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip), netip.MustParseAddr(ip6)},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr), netip.MustParsePrefix(cidr6)}}
	n.ns.Addr(t, "eth0", ip+"/24")
	n.ns.Addr(t, "eth0", ip6+"/64")
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1"} {
		k, v, _ := strings.Cut(s, "=")
		n.ns.Sysctl(t, k, v)
	}
	n.ns.Bridge(t, "cni0")
	n.ns.Addr(t, "cni0", fmt.Sprintf("10.244.%d.1/24", i))
	n.ns.Addr(t, "cni0", fmt.Sprintf("fd00:10:244:%d::1/64", i))
	n.pod = host(t, "pod"+strconv.Itoa(i), n.ns, "vpod", "eth0")
	n.ns.Attach(t, "vpod", "cni0")
	mtu := strconv.Itoa(nodeview.Settings{}.PodMTU(1500, n.Node))
	n.ns.MustExec(t, "ip", "link", "set", "vpod", "mtu", mtu)
	n.pod.MustExec(t, "ip", "link", "set", "eth0", "mtu", mtu)
	n.podIP, n.podIP6 = fmt.Sprintf("10.244.%d.2", i), fmt.Sprintf("fd00:10:244:%d::2", i)
	n.pod.Addr(t, "eth0", n.podIP+"/24")
	n.pod.Addr(t, "eth0", n.podIP6+"/64")
	n.pod.Route(t, "default", "via", fmt.Sprintf("10.244.%d.1", i))
	n.pod.Route(t, "default", "via", fmt.Sprintf("fd00:10:244:%d::1", i))
	n.h = n.ns.Netlink(t)
	l.nodes = append(l.nodes, n)
	return n
}

var (
	newNS = netns.NewNoDAD
	host  = netns.HostNoDAD
)

// gateway is the router's address on the node's subnet.
func (n *labNode) gateway(f nodeview.Family) string {
	if f == nodeview.IPv6 {
		ip := n.IPs[1].String()
		return ip[:strings.LastIndex(ip, ":")+1] + "fe"
	}
	ip := n.IPs[0].String()
	return ip[:strings.LastIndex(ip, ".")+1] + "254"
}

// facts are the Node facts of every node, as an informer would give them.
func (l *lab) facts() []nodeview.Node {
	var out []nodeview.Node
	for _, n := range l.nodes {
		out = append(out, n.Node)
	}
	return out
}

// sync runs the shell on every node with cfg and the facts of every node,
// and returns node1's plan.
func (l *lab) sync(t testing.TB, cfg overlay.Config) overlay.Plan {
	t.Helper()
	return l.syncFacts(t, cfg, l.facts())
}

func (l *lab) syncFacts(t testing.TB, cfg overlay.Config, facts []nodeview.Node) overlay.Plan {
	t.Helper()
	var first overlay.Plan
	for i, n := range l.nodes {
		if !slices.ContainsFunc(facts, func(f nodeview.Node) bool { return f.Name == n.Name }) {
			continue // a node whose Node is gone runs no agent
		}
		s, err := overlay.NewSyncer(n.h, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Sync(n.Name, facts)
		if err != nil {
			t.Fatalf("sync %s: %v\nplan:\n%s", n.Name, err, p)
		}
		if i == 0 {
			first = p
		}
	}
	return first
}

// node is the lab node by number.
func (l *lab) node(i int) *labNode { return l.nodes[i-1] }

// show is `ip`/`bridge` output in a node, for assertions and failure text.
func (n *labNode) show(t *testing.T, args ...string) string {
	t.Helper()
	return n.ns.MustExec(t, args[0], args[1:]...)
}

// ours is node's kernel state the overlay owns, one object a line.
func (n *labNode) ours(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(n.show(t, "ip", "-4", "route", "show", "proto", "207"))
	b.WriteString(n.show(t, "ip", "-6", "route", "show", "proto", "207"))
	for _, dev := range []string{overlay.DeviceV4, overlay.DeviceV6} {
		if _, err := n.ns.Exec("ip", "link", "show", dev); err != nil {
			continue
		}
		b.WriteString(n.show(t, "ip", "neigh", "show", "dev", dev, "nud", "permanent"))
		b.WriteString(n.show(t, "bridge", "fdb", "show", "dev", dev))
	}
	return spaces.ReplaceAllString(b.String(), " ")
}

var spaces = regexp.MustCompile(`[ \t]+`)
