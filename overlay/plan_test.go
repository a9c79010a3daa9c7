package overlay

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netplane/netplane/nodeview"
)

// node builds a Node from addresses and pod CIDRs in any order.
func node(name string, facts ...string) nodeview.Node {
	n := nodeview.Node{Name: name}
	for _, f := range facts {
		if strings.Contains(f, "/") {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(f))
		} else {
			n.IPs = append(n.IPs, netip.MustParseAddr(f))
		}
	}
	return n
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

var (
	eth0v4 = Underlay{Addr: netip.MustParseAddr("192.168.10.11"), Index: 2, Name: "eth0", MTU: 1500}
	eth0v6 = Underlay{Addr: netip.MustParseAddr("fd00:a::11"), Index: 2, Name: "eth0", MTU: 1500}
	self   = node("node1", "192.168.10.11", "10.244.1.0/24")
	peer   = node("node2", "192.168.10.12", "10.244.2.0/24") // on subnet A, as node1
	far    = node("node3", "192.168.20.13", "10.244.3.0/24") // on subnet B, behind a router
	subnet = prefixes("192.168.10.0/24")
)

var cs = Config{}.Defaults()

// desiredCases are plans in the words of `ip` and `bridge` (Plan.String).
var desiredCases = []struct {
	name string
	in   Input
	want string
}{{
	name: "off while WireGuard carries pod traffic: no device, route or entry to any node",
	in:   Input{Config: Config{Mode: CrossSubnet, Off: true}.Defaults(), Self: "node1", Nodes: []nodeview.Node{self, peer, far}, Connected: subnet, Underlays: []Underlay{eth0v4}},
	want: ``,
}, {
	name: "cross-subnet routes directly on the subnet and tunnels to the node behind the router",
	in:   Input{Config: cs, Self: "node1", Nodes: []nodeview.Node{self, peer, far}, Connected: subnet, Underlays: []Underlay{eth0v4}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
route 10.244.2.0/24 via 192.168.10.12 (node2)
route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan
node node2 IPv4 direct
node node3 IPv4 vxlan
`,
}, {
	name: "always tunnels to every node, also on the same subnet, with the port and VNI given",
	in: Input{Config: Config{Mode: Always, Port: 8472, VNI: 42}, Self: "node1", Nodes: []nodeview.Node{far, peer, self},
		Connected: subnet, Underlays: []Underlay{eth0v4}},
	want: `
link netplane.vxlan vxlan id 42 dstport 8472 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
route 10.244.2.0/24 via 192.168.10.12 dev netplane.vxlan onlink (node2)
route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
neigh 192.168.10.12 lladdr 0e:6e:c0:a8:0a:0c dev netplane.vxlan
neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan
fdb 0e:6e:c0:a8:0a:0c dst 192.168.10.12 dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan
node node2 IPv4 vxlan
node node3 IPv4 vxlan
`,
}, {
	name: "never has no device and reports the node behind the router",
	in:   Input{Config: Config{Mode: Never}.Defaults(), Self: "node1", Nodes: []nodeview.Node{self, peer, far}, Connected: subnet, Underlays: []Underlay{eth0v4}},
	want: `
route 10.244.2.0/24 via 192.168.10.12 (node2)
node node2 IPv4 direct
node node3 IPv4 none: InternalIP 192.168.20.13 is on no connected subnet of this node and the overlay mode is never
`,
}, {
	name: "dual stack decides each family on its own connected subnets",
	in: Input{Config: cs, Self: "node1",
		Nodes: []nodeview.Node{
			node("node1", "192.168.10.11", "fd00:a::11", "10.244.1.0/24", "fd00:10:244:1::/64"),
			node("node2", "192.168.10.12", "fd00:b::12", "10.244.2.0/24", "fd00:10:244:2::/64"),
		},
		Connected: prefixes("192.168.10.0/24", "fd00:a::/64"), Underlays: []Underlay{eth0v4, eth0v6}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
link netplane.vxlan6 vxlan id 1 dstport 4789 dev #2 local fd00:a::11 nolearning address 12:2d:92:6a:cf:94 mtu 1430 addr fd00:10:244:1::/128
route 10.244.2.0/24 via 192.168.10.12 (node2)
route fd00:10:244:2::/64 via fe80::f427:25ff:fe82:d444 dev netplane.vxlan6 onlink (node2)
neigh fe80::f427:25ff:fe82:d444 lladdr f6:27:25:82:d4:44 dev netplane.vxlan6
fdb f6:27:25:82:d4:44 dst fd00:b::12 dev netplane.vxlan6
node node2 IPv4 direct
node node2 IPv6 vxlan
`,
}, {
	name: "nodes lacking facts are skipped with a reason",
	in: Input{Config: cs, Self: "node1", Connected: subnet, Underlays: []Underlay{eth0v4},
		Nodes: []nodeview.Node{self, node("a-noip", "10.244.5.0/24"), node("b-nocidr", "192.168.10.15"),
			node("c-v6cidr", "192.168.10.16", "fd00:10:244:6::/64"), node("d-v6far", "fd00:b::17", "fd00:10:244:7::/64")}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
node a-noip IPv4 none: has IPv4 pod CIDRs but no IPv4 InternalIP
node b-nocidr - none: has no spec.podCIDRs
node c-v6cidr IPv6 none: has IPv6 pod CIDRs but no IPv6 InternalIP
node d-v6far IPv6 none: needs the IPv6 tunnel but this node has no IPv6 InternalIP on a local interface
`,
}, {
	name: "overlapping pod CIDRs and a duplicate address are not routed; the first by name keeps its route",
	in: Input{Config: cs, Self: "node1", Connected: subnet, Underlays: []Underlay{eth0v4},
		Nodes: []nodeview.Node{self, node("a-ownaddr", "192.168.10.11", "10.244.9.0/24"), node("b-selfcidr", "192.168.10.20", "10.244.1.128/25"),
			node("c-wide", "192.168.10.21", "10.244.16.0/20"), node("d-inside", "192.168.10.22", "10.244.17.0/24"),
			node("e-outside", "192.168.10.23", "10.244.0.0/16")}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
route 10.244.16.0/20 via 192.168.10.21 (c-wide)
node a-ownaddr IPv4 none: has this node's InternalIP 192.168.10.11
node b-selfcidr IPv4 none: pod CIDR 10.244.1.128/25 overlaps one of node node1
node c-wide IPv4 direct
node d-inside IPv4 none: pod CIDR 10.244.17.0/24 overlaps one of node c-wide
node e-outside IPv4 none: pod CIDR 10.244.0.0/16 overlaps one of node node1
`,
}, {
	name: "this node without pod CIDRs still gets a device, without address",
	in: Input{Config: cs, Self: "node1", Nodes: []nodeview.Node{node("node1", "192.168.10.11"), far},
		Connected: subnet, Underlays: []Underlay{eth0v4}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450
route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan
node node3 IPv4 vxlan
`,
}, {
	name: "a node with two pod CIDRs of a family gets a route each and one neighbour",
	in: Input{Config: Config{Mode: Always}.Defaults(), Self: "node1", Underlays: []Underlay{eth0v4},
		Nodes: []nodeview.Node{self, node("node4", "192.168.20.14", "10.244.4.0/24", "10.245.4.0/24")}},
	want: `
link netplane.vxlan vxlan id 1 dstport 4789 dev #2 local 192.168.10.11 nolearning address 0e:6e:c0:a8:0a:0b mtu 1450 addr 10.244.1.0/32
route 10.244.4.0/24 via 192.168.20.14 dev netplane.vxlan onlink (node4)
route 10.245.4.0/24 via 192.168.20.14 dev netplane.vxlan onlink (node4)
neigh 192.168.20.14 lladdr 0e:6e:c0:a8:14:0e dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0e dst 192.168.20.14 dev netplane.vxlan
node node4 IPv4 vxlan
`,
}}

func TestDesired(t *testing.T) {
	for _, tc := range desiredCases {
		t.Run(tc.name, func(t *testing.T) {
			got := Desired(tc.in).String()
			if want := strings.TrimPrefix(tc.want, "\n"); got != want {
				t.Errorf("plan:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestUnroutableAndCountSummariseDecisions(t *testing.T) {
	p := Desired(Input{Config: Config{Mode: Never}.Defaults(), Self: "node1", Nodes: []nodeview.Node{self, peer, far}, Connected: subnet})
	if u := p.Unroutable(); len(u) != 1 || u[0].Node != "node3" {
		t.Errorf("unroutable: %v, want node3 only", u)
	}
	if c := p.Count(); c[Direct] != 1 || c[VXLAN] != 0 || c[None] != 1 {
		t.Errorf("count: %v, want direct 1, vxlan 0, none 1", c)
	}
}

func TestChangedReportsNewChangedAndGoneDecisions(t *testing.T) {
	prev := []Decision{{Node: "a", Family: nodeview.IPv4, Path: Direct}, {Node: "b", Family: nodeview.IPv4, Path: Direct}, {Node: "c", Family: nodeview.IPv4, Path: VXLAN}}
	cur := []Decision{{Node: "a", Family: nodeview.IPv4, Path: Direct}, {Node: "b", Family: nodeview.IPv4, Path: VXLAN}, {Node: "d", Family: nodeview.IPv6, Path: VXLAN}}
	got := Changed(prev, cur)
	want := []Decision{{Node: "b", Family: nodeview.IPv4, Path: VXLAN}, {Node: "d", Family: nodeview.IPv6, Path: VXLAN}, {Node: "c", Family: nodeview.IPv4, Path: None, Reason: "gone"}}
	if len(got) != len(want) {
		t.Fatalf("changed: %v\nwant: %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("changed[%d]: %v, want %v", i, got[i], want[i])
		}
	}
}

// updateCases: one Node changes (gone: deleted) beside the nodes of
// before; want is the delta (Delta.String), or "full" when Update must
// leave it to Desired over every node.
var updateCases = []struct {
	name   string
	before []nodeview.Node
	change nodeview.Node
	gone   bool
	want   string
}{{
	name:   "a new node behind the router gets its route, neighbour and FDB entry only",
	before: []nodeview.Node{self, peer},
	change: far,
	want: `
route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan
`,
}, {
	name:   "a new node on the subnet gets a direct route only",
	before: []nodeview.Node{self, far},
	change: peer,
	want: `
route 10.244.2.0/24 via 192.168.10.12 (node2)
`,
}, {
	name:   "a deleted node loses its route, neighbour and FDB entry",
	before: []nodeview.Node{self, peer, far},
	change: far,
	gone:   true,
	want: `
del route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
del neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan
del fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan
`,
}, {
	name:   "a node that moves behind the router goes from the direct route to the tunnel",
	before: []nodeview.Node{self, peer, far},
	change: node("node2", "192.168.20.12", "10.244.2.0/24"),
	want: `
route 10.244.2.0/24 via 192.168.20.12 dev netplane.vxlan onlink (node2)
neigh 192.168.20.12 lladdr 0e:6e:c0:a8:14:0c dev netplane.vxlan
fdb 0e:6e:c0:a8:14:0c dst 192.168.20.12 dev netplane.vxlan
`,
}, {
	name:   "a new pod CIDR changes only the routes",
	before: []nodeview.Node{self, peer, far},
	change: node("node3", "192.168.20.13", "10.244.30.0/24"),
	want: `
route 10.244.30.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
del route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink (node3)
`,
}, {
	name:   "an unchanged node writes nothing",
	before: []nodeview.Node{self, peer, far},
	change: far,
	want:   "\n",
}, {
	name:   "a node whose pod CIDR overlaps another's needs the whole plan",
	before: []nodeview.Node{self, peer, far},
	change: node("node4", "192.168.10.14", "10.244.2.128/25"),
	want:   "full",
}, {
	name:   "deleting a node while another is unroutable by overlap needs the whole plan",
	before: []nodeview.Node{self, peer, node("node4", "192.168.10.14", "10.244.2.128/25")},
	change: peer,
	gone:   true,
	want:   "full",
}, {
	name:   "a change of this node needs the whole plan",
	before: []nodeview.Node{self, peer},
	change: node("node1", "192.168.10.11", "10.244.11.0/24"),
	want:   "full",
}}

// TestUpdateChangesOnlyTheNodesEntriesAndAgreesWithDesired holds Update to
// the delta of the changed node, and its plan to Desired over every node.
func TestUpdateChangesOnlyTheNodesEntriesAndAgreesWithDesired(t *testing.T) {
	for _, tc := range updateCases {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Config: cs, Self: "node1", Connected: subnet, Underlays: []Underlay{eth0v4}}
			all := in
			all.Nodes = tc.before
			prev := Desired(all)
			in.Nodes = []nodeview.Node{self}
			next, d, ok := Update(prev, in, tc.change, tc.gone)
			got := "\n" + d.String()
			if !ok {
				got = "full"
			}
			if got != tc.want {
				t.Fatalf("delta:\n%s\nwant:\n%s", got, tc.want)
			}
			if !ok {
				return
			}
			var after []nodeview.Node
			for _, n := range tc.before {
				if n.Name != tc.change.Name {
					after = append(after, n)
				}
			}
			if !tc.gone {
				after = append(after, tc.change)
			}
			all.Nodes = after
			if want := Desired(all).String(); next.String() != want {
				t.Errorf("plan after the update:\n%s\nwant, as Desired over every node:\n%s", next, want)
			}
		})
	}
}
