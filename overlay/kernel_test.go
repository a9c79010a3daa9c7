package overlay_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/netplane/netplane/e2e/netns"
	"github.com/netplane/netplane/nodeview"
	"github.com/netplane/netplane/overlay"
)

var (
	crossSubnet = overlay.Config{Mode: overlay.CrossSubnet}
	always      = overlay.Config{Mode: overlay.Always}
	never       = overlay.Config{Mode: overlay.Never}
)

// counters counts the UDP packets a node sends, by destination port, and
// those to port 8472 that carry VNI 42 (the VNI is bits 32-55 of the VXLAN
// header, which follows the 8-byte UDP header).
func counters(t *testing.T, ns *netns.NS) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "counters.nft")
	os.WriteFile(path, []byte(`table inet overlaytest {
	counter p4789 {}
	counter p8472 {}
	counter p8472v42 {}
	chain out {
		type filter hook output priority 0;
		udp dport 4789 counter name p4789
		udp dport 8472 counter name p8472
		udp dport 8472 @th,96,24 42 counter name p8472v42
	}
}
`), 0o644)
	ns.MustExec(t, "nft", "-f", path)
}

func count(t *testing.T, ns *netns.NS, name string) int {
	t.Helper()
	out := ns.MustExec(t, "nft", "list", "counter", "inet", "overlaytest", name)
	m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no packet count in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// pods are the pods' addresses of family f by node number.
func (l *lab) pod(i int, f nodeview.Family) string {
	if f == nodeview.IPv6 {
		return l.node(i).podIP6
	}
	return l.node(i).podIP
}

func TestNeverRoutesOnlyWithinTheSubnetAndReportsTheNodeBehindTheRouter(t *testing.T) {
	l := newLab(t)
	for _, n := range l.nodes {
		serve(t, n.pod)
	}
	p := l.sync(t, never)
	if u := p.Unroutable(); len(u) != 2 || u[0].Node != "node3" || u[1].Node != "node3" {
		t.Errorf("unroutable from node1: %v, want node3 in both families", u)
	}
	for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
		expectSeen(t, l.node(1).pod, l.pod(2, f), l.pod(1, f))
		expectUnreachable(t, l.node(1).pod, l.pod(3, f))
		expectUnreachable(t, l.node(3).pod, l.pod(2, f))
	}
}

func TestCrossSubnetCarriesPodTrafficBothWaysWithThePodsOwnSource(t *testing.T) {
	l := newLab(t)
	for _, n := range l.nodes {
		serve(t, n.pod)
	}
	l.sync(t, crossSubnet)
	for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
		for _, pair := range [][2]int{{1, 2}, {2, 1}, {1, 3}, {3, 1}, {2, 3}, {3, 2}} {
			expectSeen(t, l.node(pair[0]).pod, l.pod(pair[1], f), l.pod(pair[0], f))
		}
	}
	for _, pair := range [][2]int{{1, 3}, {3, 1}} {
		for _, f := range []nodeview.Family{nodeview.IPv4, nodeview.IPv6} {
			if err := l.node(pair[0]).pod.EchoBytes(at(l.pod(pair[1], f)), 1<<20); err != nil {
				t.Errorf("1 MB each way between pod%d and pod%d (%s): %v", pair[0], pair[1], f, err)
			}
		}
	}
	if t.Failed() {
		t.Logf("node1:\n%s", l.node(1).ours(t))
	}
}

func TestNodeReachesRemotePodsFromItsTunnelAddress(t *testing.T) {
	l := newLab(t)
	serve(t, l.node(3).pod)
	serve(t, l.node(2).pod)
	l.sync(t, crossSubnet)
	// Through the tunnel the node speaks from its pod network's address,
	// so the reply comes back through the tunnel; directly, from its own.
	expectSeen(t, l.node(1).ns, l.pod(3, nodeview.IPv4), "10.244.1.0")
	expectSeen(t, l.node(1).ns, l.pod(3, nodeview.IPv6), "fd00:10:244:1::")
	expectSeen(t, l.node(1).ns, l.pod(2, nodeview.IPv4), "192.168.10.11")
}
