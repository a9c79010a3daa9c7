package overlay_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

// scaleNS is one node's namespace with an underlay 10.0.0.1/16 (a veth
// whose peer stays in the namespace: this kernel has no dummy interfaces)
// and a default route, as a node on a large cluster sees it; the remote
// nodes exist only as Node facts.
func scaleNS(tb testing.TB) (*netns.NS, *netlink.Handle) {
	tb.Helper()
	ns := netns.New(tb, "scale")
	ns.MustExec(tb, "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul0-peer")
	ns.MustExec(tb, "ip", "link", "set", "ul0", "up")
	ns.MustExec(tb, "ip", "link", "set", "ul0-peer", "up")
	ns.Addr(tb, "ul0", "10.0.0.1/16")
	ns.Route(tb, "default", "via", "10.0.255.254")
	return ns, ns.Netlink(tb)
}

// scaleNodes are this node and n remote nodes: with direct, on the
// underlay's subnet (10.0.0.0/16), else on another (10.1.0.0/16). Node i
// has pod CIDR 172.16.0.0/12's i-th /24.
func scaleNodes(n int, direct bool) []nodeview.Node {
	nodes := []nodeview.Node{{Name: "self", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/24")}}}
	second := 1
	if direct {
		second = 0
	}
	for i := 1; i <= n; i++ {
		nodes = append(nodes, nodeview.Node{Name: fmt.Sprintf("node%04d", i),
			IPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, byte(second), byte(1 + i/250), byte(1 + i%250)})},
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + i>>8), byte(i), 0}), 24)}})
	}
	return nodes
}

func syncOrFail(tb testing.TB, s *overlay.Syncer, nodes []nodeview.Node) overlay.Plan {
	tb.Helper()
	p, err := s.Sync("self", nodes)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestAThousandNodesSyncWithinBudget holds the overlay to its budgets: the
// first sync of 1,000 tunnelled nodes within a second, a node that appears
// in the kernel within 100 ms. Each is the best of a few trials, so that
// what is judged is the sync's cost, not the load other processes put on a
// shared machine.
func TestAThousandNodesSyncWithinBudget(t *testing.T) {
	ns, h := scaleNS(t)
	s, err := overlay.NewSyncer(h, crossSubnet, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes := scaleNodes(1001, false)
	best := func(trials int, before func(), sync func()) time.Duration {
		var min time.Duration
		for i := range trials {
			before()
			start := time.Now()
			sync()
			if d := time.Since(start); i == 0 || d < min {
				min = d
			}
		}
		return min
	}
	first := best(3, func() { clearScale(t, ns) }, func() {
		if c := syncOrFail(t, s, nodes[:1001]).Count(); c[overlay.VXLAN] != 1000 {
			t.Fatalf("paths %v, want 1000 vxlan", c)
		}
	})
	added := best(5, func() { syncOrFail(t, s, nodes[:1001]) }, func() { syncOrFail(t, s, nodes) })
	t.Logf("first sync of 1,000 nodes %v; one node added %v (best of 3 and 5)", first, added)
	if first > time.Second || added > 100*time.Millisecond {
		t.Errorf("first sync %v (budget 1s), node added %v (budget 100ms)", first, added)
	}
	if out := ns.MustExec(t, "ip", "route", "show", "proto", "207", "via", "10.1.5.2"); out == "" {
		t.Errorf("the added node's route is not in the kernel")
	}
	if _, err := s.Sync("self", nodes[1:]); err == nil || !strings.Contains(err.Error(), `node "self" is not among`) {
		t.Errorf("sync without this node's facts: %v, want an error saying so", err)
	}
	if out := ns.MustExec(t, "ip", "route", "show", "proto", "207"); strings.Count(out, "\n") != 1001 {
		t.Errorf("after a sync without this node's facts, %d routes are left, want all 1001", strings.Count(out, "\n"))
	}
}

// clearScale removes what the overlay wrote: its routes, and the device
// with its neighbour and FDB entries.
func clearScale(tb testing.TB, ns *netns.NS) {
	ns.MustExec(tb, "ip", "route", "flush", "proto", "207")
	ns.Exec("ip", "link", "del", overlay.DeviceV4) // absent before the first sync
}

func BenchmarkSync(b *testing.B) {
	for _, direct := range []bool{false, true} {
		path := "vxlan"
		if direct {
			path = "direct"
		}
		b.Run(path+"-1000-nodes", func(b *testing.B) {
			ns, h := scaleNS(b)
			s, err := overlay.NewSyncer(h, crossSubnet, nil)
			if err != nil {
				b.Fatal(err)
			}
			nodes := scaleNodes(1001, direct)
			b.Run("first", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					clearScale(b, ns)
					b.StartTimer()
					syncOrFail(b, s, nodes[:1001])
				}
			})
			b.Run("unchanged", func(b *testing.B) {
				syncOrFail(b, s, nodes[:1001])
				for b.Loop() {
					syncOrFail(b, s, nodes[:1001])
				}
			})
			b.Run("one-node-added", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					syncOrFail(b, s, nodes[:1001])
					b.StartTimer()
					syncOrFail(b, s, nodes)
				}
			})
			// Node events: the added nodes' entries alone (SyncChanged),
			// and past eight a full sync instead.
			for _, k := range []int{1, 8, 16, 125} {
				b.Run(fmt.Sprintf("%d-nodes-added-changed", k), func(b *testing.B) {
					var added []string
					for _, n := range nodes[len(nodes)-k:] {
						added = append(added, n.Name)
					}
					for b.Loop() {
						b.StopTimer()
						syncOrFail(b, s, nodes[:len(nodes)-k])
						b.StartTimer()
						if _, err := s.SyncChanged("self", nodes, added); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// BenchmarkDesired is the pure plan of 1,000 nodes.
func BenchmarkDesired(b *testing.B) {
	in := overlay.Input{Config: crossSubnet.Defaults(), Self: "self", Nodes: scaleNodes(1000, false),
		Connected: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
		Underlays: []overlay.Underlay{{Addr: netip.MustParseAddr("10.0.0.1"), Index: 2, MTU: 1500}}}
	for b.Loop() {
		overlay.Desired(in)
	}
}
