package overlay_test

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

func TestMain(m *testing.M) { framework.Main(m) }

// lab is three nodes of a testcluster: node1 and node2 on underlay subnet
// A (192.168.10.0/24, fd00:a::/64), a bridge in a switch namespace; node3
// on subnet B (192.168.20.0/24, fd00:b::/64). The router namespace joins
// the subnets and knows nothing of pod CIDRs. Each node has a bridge cni0
// with its pod CIDR (10.244.<i>.0/24, fd00:10:244:<i>::/64) and one pod at
// .2 / ::2 on it. Nodes filter by reverse path strictly, so an asymmetric
// path shows up as a failure.
type lab struct {
	router *netns.NS
	nodes  []*labNode
}

type labNode struct {
	nodeview.Node
	ns, pod *netns.NS
	podLink string // the pod's link on the node
	h       *netlink.Handle
	podIP   string
	podIP6  string
}

func newLab(t testing.TB) *lab {
	t.Helper()
	c := testcluster.New(t, testcluster.Options{
		Nodes: 3, NoAPIServer: true, NoDAD: true,
		Subnets: []testcluster.Subnet{
			{V4: "192.168.10.", V6: "fd00:a::", Bridge: testcluster.InSwitch, Gateway: "192.168.10.254", Gateway6: "fd00:a::fe", Routed: true},
			{V4: "192.168.20.", V6: "fd00:b::", Bridge: testcluster.Link, Gateway: "192.168.20.254", Gateway6: "fd00:b::fe", Routed: true},
		},
		Place: func(i int) (int, string) { return i / 3, fmt.Sprint(10 + i) },
		Setup: func(t testing.TB, n *testcluster.Node) {
			n.NS.Sysctl(t, "net.ipv4.conf.all.rp_filter", "1")
			n.NS.Sysctl(t, "net.ipv4.conf.default.rp_filter", "1")
		},
	})
	l := &lab{router: c.Router}
	for _, cn := range c.Nodes {
		i, cidrs := cn.Index, testcluster.PodCIDRs(cn.Index, true)
		node := nodeview.Node{Name: cn.Name, IPs: []netip.Addr{netip.MustParseAddr(cn.IP), netip.MustParseAddr(cn.IP6)},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidrs[0]), netip.MustParsePrefix(cidrs[1])}}
		pod := c.AddHandPod(t, cn, testcluster.HandPod{Label: "pod" + strconv.Itoa(i), Bridge: "cni0", MTU: nodeview.Settings{}.PodMTU(1500, node),
			IPs: []string{fmt.Sprintf("10.244.%d.2/24", i), fmt.Sprintf("fd00:10:244:%d::2/64", i)}})
		l.nodes = append(l.nodes, &labNode{ns: cn.NS, pod: pod.NS, podLink: pod.Link, h: cn.NS.Netlink(t), podIP: pod.IP, podIP6: pod.IP6, Node: node})
	}
	return l
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
