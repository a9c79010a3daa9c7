package overlay_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

// fakeNode is node1 of the kernel lab in memory: eth0 on 192.168.10.0/24
// with a default route through the router; node2 shares its subnet, node3
// is behind the router.
type fakeNode struct {
	k     *overlay.FakeKernel
	s     *overlay.Syncer
	nodes []nodeview.Node
}

func newFakeNode(t *testing.T, cfg overlay.Config) *fakeNode {
	t.Helper()
	k := overlay.NewFakeKernel()
	k.AddUnderlay("eth0", 1500, netip.MustParsePrefix("192.168.10.11/24"))
	_, dflt, _ := net.ParseCIDR("0.0.0.0/0")
	if err := k.RouteReplace(&netlink.Route{Dst: dflt, Gw: net.ParseIP("192.168.10.1"), Protocol: unix.RTPROT_STATIC}); err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{k: k, nodes: []nodeview.Node{
		fact("node1", "192.168.10.11", "10.244.1.0/24"),
		fact("node2", "192.168.10.12", "10.244.2.0/24"),
		fact("node3", "192.168.20.13", "10.244.3.0/24"),
	}}
	n.syncer(t, cfg)
	k.Writes()
	return n
}

func (n *fakeNode) syncer(t *testing.T, cfg overlay.Config) {
	t.Helper()
	s, err := overlay.NewSyncer(n.k, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.s = s
}

func fact(name, ip, cidr string) nodeview.Node {
	return nodeview.Node{Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip)}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
}

const (
	eth0    = "link eth0 up mtu 1500 addr 192.168.10.11/24\n"
	vxlan   = "link netplane.vxlan vxlan id 1 dstport 4789 dev eth0 local 192.168.10.11 address 0e:6e:c0:a8:0a:0b up mtu 1450 addr 10.244.1.0/32\n"
	dflt    = "route 0.0.0.0/0 via 192.168.10.1 dev eth0 proto 4\n"
	direct2 = "route 10.244.2.0/24 via 192.168.10.12 dev eth0 proto 207\n"
	tunnel2 = "route 10.244.2.0/24 via 192.168.10.12 dev netplane.vxlan onlink proto 207\n"
	tunnel3 = "route 10.244.3.0/24 via 192.168.20.13 dev netplane.vxlan onlink proto 207\n"
	fdb2    = "fdb 0e:6e:c0:a8:0a:0c dst 192.168.10.12 dev netplane.vxlan\n"
	fdb3    = "fdb 0e:6e:c0:a8:14:0d dst 192.168.20.13 dev netplane.vxlan\n"
	neigh2  = "neigh 192.168.10.12 lladdr 0e:6e:c0:a8:0a:0c dev netplane.vxlan\n"
	neigh3  = "neigh 192.168.20.13 lladdr 0e:6e:c0:a8:14:0d dev netplane.vxlan\n"
)

// The Syncer's reading, diffing and writing on a kernel in memory: what it
// leaves, how many writes it takes, what it reports. Each case starts from
// a fresh node1; its steps run in order.
func TestSyncerOnAFakeKernel(t *testing.T) {
	crossSubnet := overlay.Config{Mode: overlay.CrossSubnet}
	for _, tc := range []struct {
		name   string
		cfg    overlay.Config
		steps  func(t *testing.T, n *fakeNode) error
		want   string
		writes int    // of the last step; -1: not counted
		err    string // in the last step's error
	}{{
		name: "cross-subnet: a route to the node on the subnet, VXLAN to the one behind the router",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			_, err := n.s.Sync("node1", n.nodes)
			return err
		},
		want:   eth0 + vxlan + dflt + direct2 + tunnel3 + fdb3 + neigh3,
		writes: 7, // the device, up, its address; an FDB entry, a neighbour, two routes
	}, {
		name: "always: both through VXLAN",
		cfg:  overlay.Config{Mode: overlay.Always},
		steps: func(t *testing.T, n *fakeNode) error {
			_, err := n.s.Sync("node1", n.nodes)
			return err
		},
		want: eth0 + vxlan + dflt + tunnel2 + tunnel3 + fdb2 + fdb3 + neigh2 + neigh3, writes: -1,
	}, {
		name: "never: no device, and the node behind the router is not routed",
		cfg:  overlay.Config{Mode: overlay.Never},
		steps: func(t *testing.T, n *fakeNode) error {
			p, err := n.s.Sync("node1", n.nodes)
			if !strings.Contains(p.String(), "node node3 IPv4 none") {
				t.Errorf("the plan does not report node3 unroutable:\n%s", p)
			}
			return err
		},
		want: eth0 + dflt + direct2, writes: 1,
	}, {
		name: "a resync with nothing changed writes nothing",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			if _, err := n.s.Sync("node1", n.nodes); err != nil {
				return err
			}
			n.k.Writes()
			_, err := n.s.Sync("node1", n.nodes)
			return err
		},
		want: eth0 + vxlan + dflt + direct2 + tunnel3 + fdb3 + neigh3, writes: 0,
	}, {
		name: "a resync heals what others deleted and removes a stray route of ours",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			if _, err := n.s.Sync("node1", n.nodes); err != nil {
				return err
			}
			_, stray, _ := net.ParseCIDR("10.244.9.0/24")
			_, two, _ := net.ParseCIDR("10.244.2.0/24")
			must(t, n.k.RouteReplace(&netlink.Route{Dst: stray, Gw: net.ParseIP("192.168.10.99"), Protocol: overlay.RouteProtocol}))
			must(t, n.k.RouteDel(&netlink.Route{Dst: two}))
			vx, err := n.k.LinkByName(overlay.DeviceV4)
			must(t, err)
			must(t, n.k.NeighDel(&netlink.Neigh{LinkIndex: vx.Attrs().Index, IP: net.ParseIP("192.168.20.13")}))
			n.k.Writes()
			_, err = n.s.Sync("node1", n.nodes)
			return err
		},
		want: eth0 + vxlan + dflt + direct2 + tunnel3 + fdb3 + neigh3, writes: 3,
	}, {
		name: "a port change recreates the device, and the routes through it come back",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			if _, err := n.s.Sync("node1", n.nodes); err != nil {
				return err
			}
			n.syncer(t, overlay.Config{Mode: overlay.CrossSubnet, Port: 8472})
			_, err := n.s.Sync("node1", n.nodes)
			return err
		},
		want:   eth0 + strings.Replace(vxlan, "dstport 4789", "dstport 8472", 1) + dflt + direct2 + tunnel3 + fdb3 + neigh3,
		writes: -1,
	}, {
		name: "a Node that comes is written by SyncChanged alone: a route others deleted stays deleted",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			if _, err := n.s.Sync("node1", n.nodes[:2]); err != nil {
				return err
			}
			_, two, _ := net.ParseCIDR("10.244.2.0/24")
			must(t, n.k.RouteDel(&netlink.Route{Dst: two}))
			n.k.Writes()
			_, err := n.s.SyncChanged("node1", n.nodes, []string{"node3"})
			return err
		},
		want: eth0 + vxlan + dflt + tunnel3 + fdb3 + neigh3, writes: 3,
	}, {
		name: "a Node that goes is removed by SyncChanged",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			if _, err := n.s.Sync("node1", n.nodes); err != nil {
				return err
			}
			n.k.Writes()
			_, err := n.s.SyncChanged("node1", n.nodes[:2], []string{"node3"})
			return err
		},
		want: eth0 + vxlan + dflt + direct2, writes: 3,
	}, {
		name: "a route the kernel refuses is reported, and the rest is written",
		cfg:  crossSubnet,
		steps: func(t *testing.T, n *fakeNode) error {
			n.k.RefuseRoute(netip.MustParsePrefix("10.244.2.0/24"), unix.EINVAL)
			_, err := n.s.Sync("node1", n.nodes)
			return err
		},
		want:   eth0 + vxlan + dflt + tunnel3 + fdb3 + neigh3,
		writes: 6,
		err:    "route 10.244.2.0/24 via 192.168.10.12 (node node2): invalid argument",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode(t, tc.cfg)
			err := tc.steps(t, n)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one saying %q", err, tc.err)
			}
			if got := n.k.Dump(); got != tc.want {
				t.Errorf("the kernel has\n%s\nwant\n%s", got, tc.want)
			}
			if got := n.k.Writes(); tc.writes >= 0 && got != tc.writes {
				t.Errorf("%d writes, want %d", got, tc.writes)
			}
		})
	}
}

// The fake refuses what the kernel refuses, with the kernel's errors.
func TestFakeKernelRefusesWhatTheKernelRefuses(t *testing.T) {
	_, far, _ := net.ParseCIDR("10.244.3.0/24")
	vxlan := func(mtu, under int) *netlink.Vxlan {
		a := netlink.NewLinkAttrs()
		a.Name, a.MTU = overlay.DeviceV4, mtu
		return &netlink.Vxlan{LinkAttrs: a, VxlanId: 1, Port: 4789, VtepDevIndex: under, SrcAddr: net.ParseIP("192.168.10.11")}
	}
	for _, tc := range []struct {
		name  string
		write func(k *overlay.FakeKernel) error
		want  error
	}{
		{"a VXLAN device on an underlay that is not there", func(k *overlay.FakeKernel) error { return k.LinkAdd(vxlan(1450, 7)) }, unix.ENODEV},
		{"a VXLAN MTU without room for the encapsulation", func(k *overlay.FakeKernel) error { return k.LinkAdd(vxlan(1451, 1)) }, unix.EINVAL},
		{"a link name taken", func(k *overlay.FakeKernel) error {
			must(t, k.LinkAdd(vxlan(1450, 1)))
			return k.LinkAdd(vxlan(1450, 1))
		}, unix.EEXIST},
		{"a route through a device that is down", func(k *overlay.FakeKernel) error {
			must(t, k.LinkAdd(vxlan(1450, 1)))
			return k.RouteReplace(&netlink.Route{Dst: far, Gw: net.ParseIP("192.168.20.13"), LinkIndex: 2, Flags: int(netlink.FLAG_ONLINK)})
		}, unix.ENETDOWN},
		{"a gateway off every connected subnet, not onlink", func(k *overlay.FakeKernel) error {
			return k.RouteReplace(&netlink.Route{Dst: far, Gw: net.ParseIP("192.168.20.13")})
		}, unix.ENETUNREACH},
		{"a route deleted while absent", func(k *overlay.FakeKernel) error { return k.RouteDel(&netlink.Route{Dst: far}) }, unix.ESRCH},
		{"an FDB entry on a device that is not VXLAN", func(k *overlay.FakeKernel) error {
			return k.NeighSet(&netlink.Neigh{LinkIndex: 1, Family: unix.AF_BRIDGE, IP: net.ParseIP("192.168.20.13"), HardwareAddr: overlay.MAC(netip.MustParseAddr("192.168.20.13"))})
		}, unix.EOPNOTSUPP},
		{"a neighbour deleted while absent", func(k *overlay.FakeKernel) error {
			return k.NeighDel(&netlink.Neigh{LinkIndex: 1, IP: net.ParseIP("192.168.10.12")})
		}, unix.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := overlay.NewFakeKernel()
			k.AddUnderlay("eth0", 1500, netip.MustParsePrefix("192.168.10.11/24"))
			if err := tc.write(k); !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
