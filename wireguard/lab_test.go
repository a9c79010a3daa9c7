package wireguard_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/e2e/testcluster"
	"github.com/netplane/netplane/wireguard"
)

// The lab: the nodes of a testcluster, each on a subnet of its own joined
// by the router namespace, each running the userspace device through this
// package with the others as peers, as the node role will. Node i sits on
// 192.168.i.0/24 (address .2, the router .1, its underlay interface eth0,
// the router's side u-node<i>) with pod CIDR 10.244.i.0/24, whose first address is on
// netplane.wg, so what the node itself sends into the tunnel leaves from
// an address the peers allow, and runs the echo servers. The routes the node role will own are made
// here from the plan: every peer's allowed IPs and the plan's Drop list
// into the device.
//
// The ghost is a node known only from its Node facts, on node 2's subnet
// (192.168.2.3) with pod CIDR 10.244.3.0/24 and no public key yet.

const (
	port     = wireguard.DefaultPort
	mtu      = 1420 // 1500 less WireGuard's IPv4 overhead
	echoPort = "8080"
	// echoTimeout bounds each answer of the echo servers.
	echoTimeout = netns.EchoTimeout
)

var ghost = wireguard.Node{Name: "ghost", IPs: []netip.Addr{netip.MustParseAddr("192.168.2.3")},
	PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}}

type lab struct {
	router *netns.NS
	links  []string // the router's links to the nodes, for captures
	nodes  []*labNode
	extra  []wireguard.Node // Node facts beside the lab's own nodes
}

type labNode struct {
	name     string
	ns       *netns.NS
	underlay netip.Addr
	podCIDR  netip.Prefix
	keyFile  string

	dev    wireguard.Device
	syncer *wireguard.Syncer
	key    wgtypes.Key
	log    logr.Logger
}

// podIP is the node's own address in its pod CIDR, on netplane.wg.
func (n *labNode) podIP() string { return n.podCIDR.Addr().Next().String() }

func newLab(t testing.TB, count int) *lab {
	t.Helper()
	var subnets []testcluster.Subnet
	for i := 1; i <= count; i++ {
		subnets = append(subnets, testcluster.Subnet{V4: fmt.Sprintf("192.168.%d.", i), Bridge: testcluster.Link,
			Gateway: fmt.Sprintf("192.168.%d.1", i), Routed: true})
	}
	c := testcluster.New(t, testcluster.Options{Nodes: count, NoAPIServer: true, Subnets: subnets,
		Place: func(i int) (int, string) { return i - 1, "2" }})
	l := &lab{router: c.Router, extra: []wireguard.Node{ghost}}
	for _, cn := range c.Nodes {
		n := &labNode{name: cn.Name, ns: cn.NS,
			underlay: netip.MustParseAddr(cn.IP),
			podCIDR:  netip.MustParsePrefix(testcluster.PodCIDRs(cn.Index, false)[0]),
			keyFile:  filepath.Join(t.TempDir(), "wireguard", "private.key"),
			log:      testr.NewWithInterface(t, testr.Options{})}
		l.nodes, l.links = append(l.nodes, n), append(l.links, cn.Link)
	}
	for _, n := range l.nodes {
		l.start(t, n)
		n.ns.ServeEcho(t, net.JoinHostPort(n.podIP(), echoPort), n.name)
	}
	return l
}

// start opens the node's device from inside its namespace (the TUN device
// and the UDP socket belong to the namespace of the thread that makes
// them), with the key of its key file, and puts its pod address on it.
func (l *lab) start(t testing.TB, n *labNode) {
	t.Helper()
	err := n.ns.Do(func() error {
		key, _, err := wireguard.LoadOrCreateKey(n.keyFile)
		if err != nil {
			return err
		}
		dev, impl, err := wireguard.Open(wireguard.Userspace, wireguard.DeviceName, mtu, port, n.log)
		if err != nil {
			return err
		}
		if impl != wireguard.Userspace {
			dev.Close()
			return fmt.Errorf("opened %s, want userspace", impl)
		}
		n.dev, n.key, n.syncer = dev, key, wireguard.NewSyncer(dev, key, port)
		return nil
	})
	if err != nil {
		t.Fatalf("start WireGuard on %s: %v", n.name, err)
	}
	dev := n.dev
	t.Cleanup(func() { dev.Close() })
	// A restarted node finds its address on the TUN device, which is
	// persistent.
	n.ns.MustExec(t, "ip", "addr", "replace", n.podIP()+"/32", "dev", wireguard.DeviceName)
}

// restart closes the node's device, as a stopping node role does (its
// TUN device stays), and starts it again on the same TUN device; with
// rotate, the key file is deleted first.
func (l *lab) restart(t testing.TB, n *labNode, rotate bool) {
	t.Helper()
	n.dev.Close()
	if rotate {
		if err := os.Remove(n.keyFile); err != nil {
			t.Fatal(err)
		}
	}
	l.start(t, n)
}

// facts are the Node facts as the API server would hold them: each lab
// node with the public key it published, and the extra nodes.
func (l *lab) facts() []wireguard.Node {
	var out []wireguard.Node
	for _, n := range l.nodes {
		out = append(out, wireguard.Node{Name: n.name, IPs: []netip.Addr{n.underlay},
			PodCIDRs: []netip.Prefix{n.podCIDR}, Key: n.key.PublicKey().String()})
	}
	return append(out, l.extra...)
}

// sync runs the node's Syncer on the facts and routes every peer's allowed
// IPs and the Drop list into the device, as the node role will.
func (l *lab) sync(t testing.TB, n *labNode, full bool) wireguard.Plan {
	t.Helper()
	plan, err := n.syncer.Sync(wireguard.Input{Self: n.name, Underlay: n.underlay, Nodes: l.facts()}, full)
	if err != nil {
		t.Fatalf("sync %s: %v", n.name, err)
	}
	dsts := plan.Drop
	for _, p := range plan.Peers {
		dsts = append(dsts, p.AllowedIPs...)
	}
	for _, d := range dsts {
		n.ns.MustExec(t, "ip", "route", "replace", d.String(), "dev", wireguard.DeviceName, "src", n.podIP())
	}
	return plan
}

// syncAll syncs every node and waits until each answers every other
// through the tunnel. Nodes that start together make their first
// handshakes at the same moment; crossed handshakes may leave the two
// nodes without common keys until WireGuard's timers make new ones
// (5 to 15 s), as they would on real nodes started together.
func (l *lab) syncAll(t testing.TB) {
	t.Helper()
	for _, n := range l.nodes {
		l.sync(t, n, true)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range l.nodes {
		for _, o := range l.nodes {
			if o == n {
				continue
			}
			// Each question is itself the wait: it ends at the answer.
			for _, err := n.ns.Ask("udp", at(o.podIP()), 200*time.Millisecond); err != nil; _, err = n.ns.Ask("udp", at(o.podIP()), 200*time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s gets no answer from %s through the tunnel within 20 s: %v", n.name, o.name, err)
				}
			}
		}
	}
}

func at(ip string) string { return net.JoinHostPort(ip, echoPort) }

func testLog(t testing.TB) logr.Logger { return testr.NewWithInterface(t, testr.Options{}) }
